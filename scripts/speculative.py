"""Speculative decoding benchmark: a target model with and without a draft model (transformers' assisted generation,
`generate(..., assistant_model=draft)`), on HumanEval-style code completion prompts, greedy and sampled.

    python scripts/speculative.py --target amd/CodeLlama-7b-hf-dir --draft amd/AMD-Llama-135m-code-dir \
        [--prompts eval/data/code_prompts.jsonl] [--modes greedy sampled] [--max_new_tokens 512] [--output out.json]

Reports, per mode: acceptance rate (accepted draft tokens / drafted tokens, summed over prompts), tokens/s with and
without the draft, speedup (= tokens/s with draft / tokens/s without, the published definition, SPEC.md 4), whether
the greedy outputs are identical, and pass@1 of the completions (each executed with its tests in a subprocess with a
time limit).

Vocab mismatch (CodeLlama 32016 vs AMD-Llama 32000): transformers only takes the same-tokenizer path when both
configs have the same vocab_size, so `pad_draft_vocab` raises the draft's vocab_size to the target's, appends -inf
logit columns for the extra ids (as the authors did), and maps those ids to the draft's unk id on the way in.
The counts come from the candidate generator itself: transformers 5.23 calls `get_candidates` (drafted tokens =
new candidate length) and then `update_candidate_strategy(..., num_matches)` (accepted tokens) once per round.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm
from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper

from instella_recipes.core.paths import EVAL_DATA_DIR

DEFAULT_PROMPTS = EVAL_DATA_DIR / "code_prompts.jsonl"
# HumanEval's stop sequences: a completion ends where the next top-level block would begin.
STOP_SEQUENCES = ["\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", '\n"""', "\nassert "]


class SpeculativeError(ValueError):
    """Bad input, detected before any model is loaded."""


# --- input checks (configs and tokenizers only; no weights are read) ---------------------------------------------
def check_model_dir(path: str | Path, role: str):
    """The config of a local model folder; a clear error if it is missing or not a model."""
    from transformers import AutoConfig

    path = Path(path)
    if not path.is_dir():
        raise SpeculativeError(f"{role} model folder not found: {path}")
    if not (path / "config.json").is_file():
        raise SpeculativeError(f"{role} folder {path} is not a model: no config.json (save it with save_pretrained)")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=True)
    except Exception as error:  # noqa: BLE001 - re-raised with the folder named
        raise SpeculativeError(f"{role} folder {path} has an unreadable config.json: {error}") from error


def check_tokenizers(target_tok, draft_tok, target_config, draft_config) -> None:
    """The draft must speak a prefix of the target's vocabulary: every draft token has the same id in the target,
    the special tokens agree, and the draft's vocab is not larger than the target's (it can be padded, not cut)."""
    if draft_config.vocab_size > target_config.vocab_size:
        raise SpeculativeError(
            f"draft vocab_size {draft_config.vocab_size} > target vocab_size {target_config.vocab_size}: "
            "the draft's logits cannot be mapped onto the target's vocabulary"
        )
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    mismatched = [tok for tok, i in draft_vocab.items() if target_vocab.get(tok) != i]
    if mismatched:
        examples = ", ".join(repr(t) for t in sorted(mismatched)[:5])
        raise SpeculativeError(
            f"draft tokenizer is incompatible with the target's: {len(mismatched)} of {len(draft_vocab)} draft tokens "
            f"have another id (or none) in the target (e.g. {examples}); train the draft with the target's tokenizer"
        )
    for name in ("bos_token_id", "eos_token_id"):
        t, d = getattr(target_tok, name), getattr(draft_tok, name)
        if t is not None and d is not None and t != d:
            raise SpeculativeError(f"draft {name} {d} != target {name} {t}")


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    path = Path(path)
    if not path.is_file():
        raise SpeculativeError(f"prompts file not found: {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for i, row in enumerate(rows):
        missing = {"task_id", "prompt", "entry_point", "test"} - set(row)
        if missing:
            raise SpeculativeError(f"{path}:{i + 1}: missing fields {sorted(missing)}")
    return rows[:limit] if limit else rows


# --- the vocab padding --------------------------------------------------------------------------------------------
def pad_draft_vocab(draft, target_vocab_size: int, unk_token_id: int = 0) -> None:
    """Make a draft with a smaller vocab usable by the same-tokenizer assisted generation path: its logits get
    `target - draft` extra columns of -inf (never proposed, probability 0 in speculative sampling), and target-only
    ids in its input are replaced by `unk_token_id` (its embedding has no row for them)."""
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    extra = target_vocab_size - draft_vocab
    if extra <= 0:
        return

    def pad_logits(module, inputs, output):
        pad = output.new_full((*output.shape[:-1], extra), float("-inf"))
        return torch.cat([output, pad], dim=-1)

    def clamp_ids(module, inputs):
        (ids,) = inputs
        return (torch.where(ids >= draft_vocab, torch.full_like(ids, unk_token_id), ids),)

    draft.get_output_embeddings().register_forward_hook(pad_logits)
    draft.get_input_embeddings().register_forward_pre_hook(clamp_ids)
    draft.config.vocab_size = target_vocab_size
    draft.config.get_text_config().vocab_size = target_vocab_size


# --- counting accepted / drafted tokens ----------------------------------------------------------------------------
@dataclass
class DraftCounts:
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")


def count_drafts(target, counts: DraftCounts) -> None:
    """Wrap the candidate generator that `target.generate(assistant_model=...)` builds, so each round adds its
    drafted tokens (candidate length) and accepted tokens (`num_matches`) to `counts`."""
    build = type(target)._get_candidate_generator

    def counted_generator(*args, **kwargs):
        generator = build(target, *args, **kwargs)
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy

        def counted_get_candidates(input_ids, *a, **kw):
            candidate_ids, candidate_logits = get_candidates(input_ids, *a, **kw)
            counts.drafted += candidate_ids.shape[1] - input_ids.shape[1]
            return candidate_ids, candidate_logits

        def counted_update(input_ids, scores, num_matches):
            counts.accepted += int(num_matches)
            counts.rounds += 1
            return update(input_ids, scores, num_matches)

        generator.get_candidates, generator.update_candidate_strategy = counted_get_candidates, counted_update
        return generator

    target._get_candidate_generator = counted_generator


# --- running and scoring ------------------------------------------------------------------------------------------
def truncate_completion(text: str) -> str:
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def passes(problem: dict, completion: str, timeout: float = 10.0) -> bool:
    """Run prompt + completion + tests + `check(entry_point)` in a fresh Python with a time limit."""
    program = f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "program.py"
        script.write_text(program)
        try:
            result = subprocess.run(
                [sys.executable, "-I", str(script)], cwd=folder, capture_output=True, timeout=timeout,
                env={"PATH": os.environ.get("PATH", "")},
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            return False
    return result.returncode == 0


@dataclass
class ModeResult:
    mode: str
    new_tokens_base: int = 0
    new_tokens_assisted: int = 0
    seconds_base: float = 0.0
    seconds_assisted: float = 0.0
    counts: DraftCounts = field(default_factory=DraftCounts)
    identical: int = 0
    prompts: int = 0
    passed_base: int = 0
    passed_assisted: int = 0

    def summary(self) -> dict:
        base_tps = self.new_tokens_base / self.seconds_base if self.seconds_base else float("nan")
        assisted_tps = self.new_tokens_assisted / self.seconds_assisted if self.seconds_assisted else float("nan")
        return {
            "mode": self.mode,
            "prompts": self.prompts,
            "acceptance_rate": self.counts.acceptance_rate,
            "drafted_tokens": self.counts.drafted,
            "accepted_tokens": self.counts.accepted,
            "tokens_per_s_base": base_tps,
            "tokens_per_s_assisted": assisted_tps,
            "speedup": assisted_tps / base_tps if base_tps else float("nan"),
            "identical_outputs": self.identical,
            "pass@1_base": self.passed_base / self.prompts if self.prompts else float("nan"),
            "pass@1_assisted": self.passed_assisted / self.prompts if self.prompts else float("nan"),
        }


def _generate(model, input_ids, gen_kwargs, seed, draft=None):
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft, **gen_kwargs)
    return out[0, input_ids.shape[1] :], time.perf_counter() - start


def run_mode(
    target, draft, tokenizer, prompts, mode, max_new_tokens, timeout=10.0, seed=0, gen_overrides=None, execute=True
):
    """One decoding mode over all prompts, with and without the draft; execution-scored unless `execute=False`."""
    gen_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": mode == "sampled"}
    gen_kwargs["pad_token_id"] = tokenizer.pad_token_id
    if mode == "sampled":
        # HumanEval pass@1 sampling (temperature 0.2, top-p 0.95), passed as logits processors rather than as
        # generation-config fields: transformers 5.23 hands the target's processors to the draft's generate(), which
        # also builds its own from the config, so config-set warpers are applied twice to the draft (its q becomes
        # softmax(logits / 0.04)) and acceptance collapses (measured: 8/67 with a draft equal to the target).
        gen_kwargs["logits_processor"] = LogitsProcessorList([TemperatureLogitsWarper(0.2), TopPLogitsWarper(0.95)])
    gen_kwargs.update(gen_overrides or {})
    result = ModeResult(mode)
    counts = result.counts
    count_drafts(target, counts)
    for i, problem in enumerate(tqdm(prompts, desc=f"{mode} (target, then target+draft)", leave=False)):
        input_ids = tokenizer(problem["prompt"], return_tensors="pt").input_ids
        base, t_base = _generate(target, input_ids, gen_kwargs, seed + i)
        assisted, t_assisted = _generate(target, input_ids, gen_kwargs, seed + i, draft=draft)
        result.prompts += 1
        result.new_tokens_base += base.numel()
        result.new_tokens_assisted += assisted.numel()
        result.seconds_base += t_base
        result.seconds_assisted += t_assisted
        result.identical += int(torch.equal(base, assisted))
        for ids, attr in ((base, "passed_base"), (assisted, "passed_assisted")) if execute else ():
            completion = truncate_completion(tokenizer.decode(ids, skip_special_tokens=True))
            setattr(result, attr, getattr(result, attr) + passes(problem, completion, timeout))
    return result


def load_pair(target_dir, draft_dir, dtype=torch.float32):
    """Check both folders and tokenizers (no weights read), then load both models and pad the draft's vocab."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target_config = check_model_dir(target_dir, "target")
    draft_config = check_model_dir(draft_dir, "draft")
    try:
        target_tok = AutoTokenizer.from_pretrained(target_dir, trust_remote_code=True)
        draft_tok = AutoTokenizer.from_pretrained(draft_dir, trust_remote_code=True)
    except Exception as error:  # noqa: BLE001
        raise SpeculativeError(f"cannot load a tokenizer: {error}") from error
    check_tokenizers(target_tok, draft_tok, target_config, draft_config)
    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, trust_remote_code=True).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=dtype, trust_remote_code=True).eval()
    unk = draft_tok.unk_token_id if draft_tok.unk_token_id is not None else 0
    pad_draft_vocab(draft, target.config.get_text_config().vocab_size, unk)
    if target_tok.pad_token_id is None:
        target_tok.pad_token = target_tok.eos_token
    return target, draft, target_tok


def format_markdown(summaries: list[dict]) -> str:
    lines = [
        "| mode | acceptance | tok/s target | tok/s target+draft | speedup | identical | pass@1 target | "
        "pass@1 target+draft |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| {s['mode']} | {s['acceptance_rate']:.3f} ({s['accepted_tokens']}/{s['drafted_tokens']}) | "
            f"{s['tokens_per_s_base']:.1f} | {s['tokens_per_s_assisted']:.1f} | {s['speedup']:.2f}x | "
            f"{s['identical_outputs']}/{s['prompts']} | {s['pass@1_base']:.2f} | {s['pass@1_assisted']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="target model folder (HF format)")
    parser.add_argument("--draft", required=True, help="draft model folder (HF format, target's tokenizer or prefix)")
    parser.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="jsonl: task_id, prompt, entry_point, test")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampled"], choices=["greedy", "sampled"])
    parser.add_argument("--max_new_tokens", type=int, default=512)
    parser.add_argument("--num_assistant_tokens", type=int, default=None, help="draft tokens per round")
    parser.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per executed completion")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--output", default=None, help="write the summaries as JSON here")
    args = parser.parse_args(argv)
    try:
        prompts = load_prompts(args.prompts, args.limit)
        target, draft, tokenizer = load_pair(args.target, args.draft, getattr(torch, args.dtype))
    except SpeculativeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if args.num_assistant_tokens:
        draft.generation_config.num_assistant_tokens = args.num_assistant_tokens
        draft.generation_config.num_assistant_tokens_schedule = "constant"
    summaries = [
        run_mode(target, draft, tokenizer, prompts, mode, args.max_new_tokens, args.timeout).summary()
        for mode in args.modes
    ]
    print(format_markdown(summaries))
    if args.output:
        Path(args.output).write_text(json.dumps(summaries, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
