"""Token-file writing cost: our dolma-compatible writer (`instella_recipes.data.dolma_tokens.write_group`, what each
`prepare_data --layout olmo` worker runs) vs `dolma tokens`' own (dolma 1.1.2, the authors' tool, its
`tokenize_in_parallel` in debug mode: one group, in process), on the same jsonl.gz files with the authors'
settings and the real OLMo tokenizer, one core each (TOKENIZERS_PARALLELISM=false, as dolma sets it).

The measure is each writer's CPU time (`time.process_time`, interpreter start-up and imports excluded), which is
what a 200-process tokenisation node spends per core; wall time is printed too, but on a shared host it mostly
measures the other jobs. Every pair is checked to hold the same documents.

    python benchmarks/bench_dolma_tokens.py [--docs 10000] [--files 2] [--repeats 3]
        [--dolma_python PATH]   # a Python with dolma 1.1.2 (default: built from
        tests/helpers/dolma_oracle_requirements.txt)
"""

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKENIZER = ROOT / "recipes" / "instella-3b" / "tokenizer" / "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"
MAX_SIZE = 10**8

DOLMA = """
import os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from dolma.tokenizer import tokenize_in_parallel
files, dest, tok, max_size = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
c, w = time.process_time(), time.perf_counter()
tokenize_in_parallel(sources=files, destination=dest, num_writers=1, tokenizer_name_or_path=tok, eos_token_id=0,
                     pad_token_id=1, max_size=max_size, seed=0, debug=True)
print(time.process_time() - c, time.perf_counter() - w)
"""
OURS = """
import os, sys, time
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from pathlib import Path
import numpy as np
from tokenizers import Tokenizer
from instella_recipes.data import dolma_tokens as dt
files, dest, tok, max_size = sys.argv[1].split(","), sys.argv[2], sys.argv[3], int(sys.argv[4])
Path(dest).mkdir(parents=True)
c, w = time.process_time(), time.perf_counter()
dt.write_group(0, files, Path(dest) / "part-0", Tokenizer.from_file(tok), 0, np.dtype("<u2"),
               dt.DolmaTokensArguments(max_size=max_size))
print(time.process_time() - c, time.perf_counter() - w)
"""


def build_dolma(where: Path) -> Path:
    venv = where / "dolma-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    requirements = ROOT / "tests" / "helpers" / "dolma_oracle_requirements.txt"
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "-r", str(requirements)], check=True)
    return python


def write_inputs(folder: Path, docs: int, files: int) -> list[str]:
    from benchmarks.bench_prepare_data import make_docs

    texts = make_docs(docs)
    folder.mkdir(parents=True)
    paths = []
    for f in range(files):
        path = folder / f"shard-{f:03d}.jsonl.gz"
        with gzip.open(path, "wt") as handle:
            for i in range(f, len(texts), files):
                handle.write(json.dumps({"id": f"doc-{i}", "text": texts[i]}) + "\n")
        paths.append(str(path))
    return paths


def documents(folder: Path) -> Counter:
    out = Counter()
    for npy in folder.glob("*.npy"):
        ids = np.fromfile(npy, dtype="<u2")
        rows = gzip.decompress(npy.with_suffix(".csv.gz").read_bytes()).decode().splitlines()
        out.update(ids[int(r.split(",")[0]) : int(r.split(",")[1])].tobytes() for r in rows)
    return out


def run(python: Path, code: str, files: list[str], dest: Path) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["NLTK_DATA"] = str(dest.parent / "nltk_data")  # an empty sentence splitter: dolma's import downloads none
    argv = [str(python), "-c", code, ",".join(files), str(dest), str(TOKENIZER), str(MAX_SIZE)]
    out = subprocess.run(argv, check=True, env=env, capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=10000)
    parser.add_argument("--files", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dolma_python", default=None)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_dolma_tokens_"))
    dolma_python = Path(args.dolma_python) if args.dolma_python else build_dolma(work)
    files = write_inputs(work / "docs", args.docs, args.files)
    (work / "nltk_data" / "tokenizers" / "punkt").mkdir(parents=True)
    cpu, wall = {"dolma": [], "ours": []}, {"dolma": [], "ours": []}
    tokens = 0
    for r in range(args.repeats):
        jobs = [("dolma", dolma_python, DOLMA), ("ours", Path(sys.executable), OURS)]
        for name, python, code in jobs if r % 2 == 0 else jobs[::-1]:
            c, w = run(python, code, files, work / f"{name}{r}")
            cpu[name].append(c)
            wall[name].append(w)
        theirs, mine = documents(work / f"dolma{r}"), documents(work / f"ours{r}")
        assert theirs == mine, "the two writers hold different documents"
        tokens = sum(len(doc) // 2 * n for doc, n in mine.items())
    median = {k: statistics.median(v) for k, v in cpu.items()}
    lines = [
        f"{args.docs} web-like documents in {args.files} jsonl.gz files ({tokens:,} tokens with EOS), one group "
        f"(dolma `--processes 1`), `max_size` {MAX_SIZE:,}, `seed 0`, EOS 0, {args.repeats} repeats in alternating "
        "order, each writer in its own process on one core; CPU seconds of the writing alone. Each pair checked to "
        "hold the same documents.",
        "",
        "| writer | CPU s (median) | CPU s (all) | tokens per CPU second | wall s (median; shared host) |",
        "|---|---|---|---|---|",
    ]
    for name in ("dolma", "ours"):
        lines.append(
            f"| {name} | {median[name]:.2f} | {', '.join(f'{c:.2f}' for c in cpu[name])} | "
            f"{tokens / median[name]:,.0f} | {statistics.median(wall[name]):.1f} |"
        )
    ratio = median["dolma"] / median["ours"]
    lines += ["", f"dolma CPU / ours CPU (median): **{ratio:.2f}** (above 1 = ours cheaper)."]
    body = "\n".join(lines)
    print(body)
    from benchmarks.results_io import record

    shown = [a for i, a in enumerate(sys.argv[1:]) if "--dolma_python" not in (a, sys.argv[i] if i else "")]
    command = " ".join(["python benchmarks/bench_dolma_tokens.py", *shown])  # the dolma venv path is not repeatable
    record("dolma_tokens", "Token files (layout olmo) vs dolma tokens, CPU per core", body, command)


if __name__ == "__main__":
    main()
