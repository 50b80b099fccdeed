"""Scaling of `prepare_data --layout olmo`: tokens per CPU-second and wall time for 1 and 2 worker processes
(`--num_proc`) and 1 and 2 datatrove tasks (`--executor local --tasks N --workers N`), beside datatrove's own
`DocumentTokenizer` (JsonlReader -> DocumentTokenizer, 1 and 2 tasks) and `dolma tokens` (dolma 1.1.2, the authors'
tool, 1 and 2 processes), all on the same jsonl.gz files with the OLMo tokenizer, in one run.

Each configuration is a fresh command (interpreter start-up and imports included: what a user pays), run under this
process as a child subreaper, so the CPU time counted is that of every process it started (forkservers, workers,
managers), not only the first. Wall time is printed too; on a shared host it mostly measures the other jobs, which
is why the CPU measure comes first.

    python benchmarks/bench_token_tasks.py [--docs 8000] [--files 4] [--only ours]
        [--dolma_python PATH]   # a Python with dolma 1.1.2 (default: built from tests/helpers/...requirements.txt)
"""

import argparse
import ctypes
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
TOKENIZER = ROOT / "recipes" / "instella-3b" / "tokenizer" / "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"
MAX_SIZE = 10**8
PR_SET_CHILD_SUBREAPER = 36

DATATROVE = """
import sys
from datatrove.executor import LocalPipelineExecutor
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
docs, out, tok, tasks = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if __name__ == "__main__":
    LocalPipelineExecutor(
        [JsonlReader(docs), DocumentTokenizer(out, tokenizer_name_or_path=tok, eos_token="<|endoftext|>", seed=0)],
        tasks=tasks, workers=tasks, logging_dir=out + ".logs",
    ).run()
"""
DOLMA = """
import os, sys
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from dolma.tokenizer import tokenize_in_parallel
files, dest, tok = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
max_size, procs = int(sys.argv[4]), int(sys.argv[5])
if __name__ == "__main__":
    tokenize_in_parallel(sources=files, destination=dest, num_writers=procs, tokenizer_name_or_path=tok,
                         eos_token_id=0, pad_token_id=1, max_size=max_size, seed=0, debug=procs == 1)
"""


def become_subreaper() -> None:
    """Orphaned descendants (a forkserver's workers) are re-parented to us, so we wait for them and count their CPU."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def measure(argv: list[str], env: dict) -> tuple[float, float]:
    """(CPU seconds of the whole process tree, wall seconds) of one command, which must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, err = child.communicate()
    if child.returncode != 0:
        raise RuntimeError(f"{argv[:4]} failed:\n{err[-3000:]}")
    while True:  # the descendants left behind (re-parented to us)
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def ours(out: Path, docs: Path, groups: int, *extra: str) -> list[str]:
    source = {"name": "web", "path": str(docs), "data_files": ["*"], "destination": "web"}
    return [sys.executable, str(ROOT / "scripts" / "prepare_data.py"), "--layout", "olmo", "--output_dir", str(out),
            "--tokenizer", str(TOKENIZER), "--sources", json.dumps(source), "--processes", str(groups),
            "--max_size", str(MAX_SIZE), *extra]  # fmt: skip


def npy_tokens(folder: Path, pattern: str) -> int:
    return sum(p.stat().st_size for p in folder.rglob(pattern)) // 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--only", choices=["ours", "all"], default="all")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dolma_python", default=None)
    args = parser.parse_args()
    from benchmarks.bench_dolma_tokens import build_dolma, write_inputs

    become_subreaper()
    work = Path(tempfile.mkdtemp(prefix="bench_token_tasks_"))
    files = write_inputs(work / "docs", args.docs, args.files)
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "HF_HUB_OFFLINE": "1"}
    runs = [
        ("ours, 1 process (`--num_proc 1`)", ours(work / "p1", work / "docs", args.files, "--num_proc", "1")),
        ("ours, 2 processes (`--num_proc 2`)", ours(work / "p2", work / "docs", args.files, "--num_proc", "2")),
        ("ours, 1 datatrove task", ours(work / "t1", work / "docs", args.files, "--executor", "local")),
        ("ours, 2 datatrove tasks (`--tasks 2 --workers 2`)",
         ours(work / "t2", work / "docs", args.files, "--executor", "local", "--tasks", "2", "--workers", "2")),
    ]  # fmt: skip
    if args.only == "all":
        for n in (1, 2):
            runs.append((f"datatrove DocumentTokenizer, {n} task(s)",
                         [sys.executable, "-c", DATATROVE, str(work / "docs"), str(work / f"dt{n}"), str(TOKENIZER),
                          str(n)]))  # fmt: skip
        dolma = Path(args.dolma_python) if args.dolma_python else build_dolma(work)
        dolma_env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        (work / "nltk_data" / "tokenizers" / "punkt").mkdir(parents=True)
        dolma_env["NLTK_DATA"] = str(work / "nltk_data")  # dolma's import downloads no sentence splitter
        for n in (1, 2):
            runs.append((f"dolma tokens 1.1.2, {n} process(es)",
                         [str(dolma), "-c", DOLMA, ",".join(files), str(work / f"dolma{n}"), str(TOKENIZER),
                          str(MAX_SIZE), str(n)], dolma_env))  # fmt: skip
    results, counts, tokens = {name: [] for name, *_ in runs}, {}, None
    for r in range(args.repeats):  # alternating order: a trend in the host's load hits every row alike
        for name, argv, *run_env in runs if r % 2 == 0 else runs[::-1]:
            out = Path(argv[argv.index("--output_dir") + 1]) if "--output_dir" in argv else Path(argv[4])
            shutil.rmtree(out, ignore_errors=True)
            for extra in (Path(f"{out}.tasks"), Path(f"{out}.logs")):
                shutil.rmtree(extra, ignore_errors=True)
            cpu, wall = measure(argv, run_env[0] if run_env else env)
            count = npy_tokens(out, "*.npy") or npy_tokens(out, "*.ds")
            tokens = tokens or count
            counts[name] = count  # datatrove's tokenizer does not strip the text as dolma does: a few more tokens
            results[name].append((cpu, wall))
            print(f"{name}: {count:,} tokens, {cpu:.1f} CPU s, {wall:.1f} s wall", flush=True)
    rows = [(n, statistics.median(c for c, _ in v), statistics.median(w for _, w in v), v) for n, v in results.items()]
    lines = [
        f"{args.docs} web-like documents in {args.files} jsonl.gz files, {tokens:,} tokens (EOS included), OLMo "
        f"tokenizer; ours and dolma with {args.files} groups (`processes`), `max_size` {MAX_SIZE:,}. Each row one "
        f"fresh command; CPU = every process it started (start-up and imports included), measured as a child "
        f"subreaper; wall on a shared host. Medians of {args.repeats} runs in alternating order.",
        "",
        "| configuration | tokens | CPU s, median (each run) | tokens per CPU-second | wall s, median (each run) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {counts[n]:,} | {c:.1f} ({', '.join(f'{x:.1f}' for x, _ in v)}) | {counts[n] / c:,.0f} | {w:.1f} "
        f"({', '.join(f'{y:.0f}' for _, y in v)}) |"
        for n, c, w, v in rows
    ]
    body = "\n".join(lines)
    print(body)
    from benchmarks.results_io import record

    shown = [a for i, a in enumerate(sys.argv[1:]) if "--dolma_python" not in (a, sys.argv[i] if i else "")]
    record("token_tasks", "prepare_data (layout olmo) scaling: processes, tasks, datatrove, dolma",
           body, " ".join(["python benchmarks/bench_token_tasks.py", *shown]))  # fmt: skip


if __name__ == "__main__":
    main()
