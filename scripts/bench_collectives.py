"""Collective microbenchmarks (all-reduce, reduce-scatter, all-gather, broadcast, all-to-all), nccl-tests style.

    torchrun --nproc_per_node 8 scripts/bench_collectives.py --output_dir runs/bench/8gpu
    accelerate launch --multi_gpu --num_processes 8 scripts/bench_collectives.py --max_bytes 1G
    torchrun --standalone --nproc_per_node 4 scripts/bench_collectives.py --backend gloo --max_bytes 16M   # CPU
    python scripts/bench_collectives.py --backend gloo     # one process (a world of 1: latency floor only)

Every rank runs the sweep; rank 0 prints one line per (collective, size) and writes results.csv, results.json and
busbw.png into `output_dir`. Sizes: `--sizes 1K 64K 1M` or a sweep `--min_bytes 1K --max_bytes 1G --step_factor 2`.
The backend defaults to NCCL (RCCL on ROCm) when GPUs are visible, gloo otherwise.
Formulas and the correctness check: instella_recipes/systems/collectives.py.
"""

try:
    from instella_recipes.systems.collectives import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    raise SystemExit(main())
