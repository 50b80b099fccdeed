"""Verified programs per second through the sandbox: the warm worker pool vs one sandbox per program, side by side.

A "verified program" is one step-2 check of the pipeline: a generated `answer(...)` run on the seed's values in the
sandbox (bubblewrap, all limits on) and its result compared with the gold answer. Same programs, same limits, same
number of concurrent runs for both.

    python benchmarks/bench_sandbox.py [--programs 400 --workers 2]
"""

import argparse
import os
import random
import sys
import time
from pathlib import Path

try:  # run as a file (`python benchmarks/bench_sandbox.py`), the repository root is not on the path
    from benchmarks.results_io import record
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.results_io import record
from instella_recipes.sandbox import SandboxConfig, SandboxPool


def programs(count: int, seed: int = 0) -> list[tuple[str, list[dict], float]]:
    """GSM8K-like programs (a few arithmetic steps, `math`, a short loop) with their expected answers."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b, c = rng.randint(2, 50), rng.randint(2, 20), rng.randint(1, 30)
        source = (
            "def answer(a, b, c):\n"
            "    total = a * b\n"
            "    for _ in range(3):\n"
            "        total += c\n"
            "    return math.floor(total / 1) - c\n"
        )
        out.append((source, [{"a": a, "b": b, "c": c}], a * b + 2 * c))
    return out


def measure(pool: SandboxPool, jobs: list) -> tuple[float, int]:
    start = time.perf_counter()
    reports = pool.run_many([(src, calls) for src, calls, _ in jobs])
    elapsed = time.perf_counter() - start
    verified = sum(r.results[0].ok and r.results[0].value == gold for r, (_, _, gold) in zip(reports, jobs))
    return elapsed, verified


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--programs", type=int, default=400)
    parser.add_argument("--baseline_programs", type=int, default=60, help="one-sandbox-per-program is slow")
    parser.add_argument("--workers", type=int, default=2 * (os.cpu_count() or 1), help="concurrent runs (workers)")
    args = parser.parse_args()
    config = SandboxConfig(workers=args.workers)

    with SandboxPool(config) as pool:
        measure(pool, programs(20, seed=1))  # warm-up
        pool_time, pool_ok = measure(pool, programs(args.programs))
    with SandboxPool(config, one_shot=True) as fresh:
        one_time, one_ok = measure(fresh, programs(args.baseline_programs))

    pool_rate, one_rate = pool_ok / pool_time, one_ok / one_time
    body = (
        f"{args.programs} programs through the warm pool, {args.baseline_programs} through one bubblewrap sandbox per "
        f"program; {args.workers} concurrent runs each; bubblewrap isolation, 30 s wall/CPU, 1 GiB address space, "
        "1 process, 1 MiB output cap per program.\n\n"
        "| sandbox | verified programs | seconds | verified programs/s |\n|---|---|---|---|\n"
        f"| warm worker pool (ours) | {pool_ok}/{args.programs} | {pool_time:.2f} | **{pool_rate:.0f}** |\n"
        f"| one sandbox per program | {one_ok}/{args.baseline_programs} | {one_time:.2f} | {one_rate:.0f} |\n\n"
        f"Pool / per-program: **{pool_rate / one_rate:.1f}x**. Goal: >= 100 verified programs/s with the pool: "
        f"{'met' if pool_rate >= 100 else 'NOT met'}."
    )
    print(body)
    record("sandbox", "Synthetic GSM8K sandbox throughput (verified programs/s)", body)


if __name__ == "__main__":
    main()
