"""Data preparation throughput: `recipes/prepare_data` end to end (read jsonl with `datasets`, tokenise with
`map(batched=True, num_proc=N)`, append EOS, shuffle, pack 4096-token windows, write tokens.bin + manifest) vs the
bare `tokenizers` batch encode of the same texts (`Tokenizer.encode_batch_fast`, all cores), with the real OLMo
tokenizer. Goal: ours >= 0.9 x bare (packing and writing cost under 10%).

    python benchmarks/bench_prepare_data.py [--docs 20000] [--num_proc 2]
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = ROOT / "tests" / "fixtures" / "tokenizers" / "olmo-gpt-neox-20b-pii-special.json"


BATCH = 1000  # documents per encode call, ours (PrepareArguments.batch_size) and bare alike


def make_docs(n: int, seed: int = 0) -> list[str]:
    """Web-like documents of ~300-3000 characters built from the tiny world's sentences."""
    from instella_recipes.data.tiny_world import TinyWorld

    sentences = [row["text"] for row in TinyWorld().corpus()]
    rng = random.Random(seed)
    return [" ".join(rng.choice(sentences) for _ in range(rng.randint(3, 30))) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20000)
    parser.add_argument("--num_proc", type=int, default=None, help="default: prepare_data's (1 process)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if not TOKENIZER.exists():
        sys.exit(f"OLMo tokenizer not found at {TOKENIZER}")
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tokenizers import Tokenizer

    from instella_recipes.data.prepare import PrepareArguments, prepare

    docs = make_docs(args.docs)
    work = Path(tempfile.mkdtemp(prefix="bench_prepare_"))
    text = "".join(json.dumps({"text": d}) + "\n" for d in docs)
    mb = len(text.encode()) / 1e6

    bare = Tokenizer.from_file(str(TOKENIZER))
    bare_times, ours_times = [], []
    for r in range(args.repeats):
        # the same batch size as ours: one call over all documents holds every Encoding at once and runs slower
        start = time.perf_counter()
        n_tokens = len(docs)  # + one EOS per document, as ours writes
        for i in range(0, len(docs), BATCH):
            n_tokens += sum(len(e.ids) for e in bare.encode_batch_fast(docs[i : i + BATCH], add_special_tokens=False))
        bare_times.append(time.perf_counter() - start)

        # a new file each time: datasets caches load and map results by fingerprint, and the benchmark measures a
        # cold run (reading the jsonl included)
        src = work / f"corpus{r}.jsonl"
        src.write_text(text)
        out = work / f"out{r}"
        start = time.perf_counter()
        prepare(PrepareArguments(output_dir=str(out), sources=[str(src)], tokenizer=str(TOKENIZER), seq_len=4096,
                                 num_proc=args.num_proc, seed=0, batch_size=BATCH))  # fmt: skip
        ours_times.append(time.perf_counter() - start)
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["tokens"][str(src)]["natural"] == n_tokens, "ours and bare disagree on the token count"

    bare_t, ours_t = min(bare_times), min(ours_times)
    body = (
        f"{args.docs} documents, {mb:.1f} MB of jsonl, {n_tokens:,} tokens (EOS included), OLMo tokenizer, "
        f"4096-token windows, num_proc={args.num_proc}; best of {args.repeats}.\n\n"
        "| | seconds | tokens/s |\n|---|---|---|\n"
        f"| bare `tokenizers` `encode_batch_fast`, {BATCH} documents per call (all cores) | {bare_t:.2f} | "
        f"{n_tokens / bare_t:,.0f} |\n"
        f"| ours: `prepare_data` end to end (read, tokenise, pack, write, manifest) | {ours_t:.2f} | "
        f"{n_tokens / ours_t:,.0f} |\n\n"
        f"**Ratio ours / bare: {bare_t / ours_t:.2f}** (goal >= 0.9)."
    )
    print(body)
    from benchmarks.results_io import record

    record("prepare_data", "Data preparation throughput (prepare_data vs bare tokenizers)", body)


if __name__ == "__main__":
    main()
