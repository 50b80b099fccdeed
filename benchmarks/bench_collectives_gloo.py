"""Bus-bandwidth curves of the five collectives with gloo on this machine, 2 and 4 processes, side by side.

    python benchmarks/bench_collectives_gloo.py [--max_bytes 64M] [--iters 10]

Runs `scripts/bench_collectives.py` under torchrun for each world size, then records the busbw table (and the ratio
4-process / 2-process busbw, which shows how gloo's ring scales on shared-memory TCP) with `results_io.record`.
The plots are copied to benchmarks/results/collectives_gloo_<n>.png.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:  # run as a file (`python benchmarks/bench_collectives_gloo.py`), the repository root is not on the path
    from benchmarks.results_io import HERE, record
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.results_io import HERE, record
from instella_recipes.systems.collectives import human

ROOT = HERE.parent


def run(world: int, args, out: Path) -> list[dict]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
        str(ROOT / "scripts" / "bench_collectives.py"), "--backend", "gloo", "--min_bytes", args.min_bytes,
        "--max_bytes", args.max_bytes, "--step_factor", "4", "--warmup", "2", "--iters", str(args.iters),
        "--output_dir", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, env=env, check=True)
    return json.loads((out / "results.json").read_text())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--min_bytes", default="1K")
    parser.add_argument("--max_bytes", default="64M")
    parser.add_argument("--iters", type=int, default=10)
    args = parser.parse_args()
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        for world in (2, 4):
            out = Path(tmp) / str(world)
            runs[world] = {(r["collective"], r["size_bytes"]): r for r in run(world, args, out)}
            (HERE / "results").mkdir(exist_ok=True)
            shutil.copy(out / "busbw.png", HERE / "results" / f"collectives_gloo_{world}.png")
    lines = [
        "| collective | size | 2 proc time (us) | 2 proc busbw (GB/s) | 4 proc time (us) | 4 proc busbw (GB/s) | "
        "busbw 4/2 | correct |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, two in runs[2].items():
        four = runs[4][key]
        ratio = four["busbw_gbps"] / two["busbw_gbps"]
        ok = "yes" if two["correct"] and four["correct"] else "NO"
        lines.append(
            f"| {key[0]} | {human(key[1])} | {two['time_us']:.0f} | {two['busbw_gbps']:.4g} | {four['time_us']:.0f} | "
            f"{four['busbw_gbps']:.4g} | {ratio:.2f} | {ok} |"
        )
    body = (
        "gloo over loopback TCP on a shared 2-core CPU machine (other jobs running), float32, nccl-tests busbw "
        "(all-reduce x 2(n-1)/n, reduce-scatter / all-gather / all-to-all x (n-1)/n, broadcast x 1), time = slowest "
        "rank's mean over the timed iterations. Every result checked exactly. With 4 processes on 2 cores the ranks "
        "time-share, so the 4/2 ratio measures CPU oversubscription as much as the algorithm. Plots: "
        "`benchmarks/results/collectives_gloo_2.png`, `collectives_gloo_4.png`.\n\n" + "\n".join(lines)
    )
    print(record("collectives_gloo", "Collective bus bandwidth, gloo, 2 and 4 processes (CPU)", body))


if __name__ == "__main__":
    main()
