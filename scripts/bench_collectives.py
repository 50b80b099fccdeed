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

import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from instella_recipes.core import (
    RecipeError,
    check_range,
    exit_on_recipe_error,
    parse_recipe,
    setup_logging,
)
from instella_recipes.systems.collectives import (
    COLLECTIVES,
    human,
    parse_size,
    run_sweep,
    size_sweep,
    validate,
    write_outputs,
)


@dataclass
class BenchArguments:
    output_dir: str = field(default="runs/bench_collectives", metadata={"help": "where rank 0 writes CSV/JSON/PNG"})
    collectives: list[str] = field(default_factory=lambda: list(COLLECTIVES), metadata={"help": str(COLLECTIVES)})
    sizes: list[str] = field(default_factory=list, metadata={"help": "explicit sizes (1K 4MiB 1G); overrides sweep"})
    min_bytes: str = field(default="1K", metadata={"help": "sweep start"})
    max_bytes: str = field(default="1G", metadata={"help": "sweep end (inclusive)"})
    step_factor: int = field(default=2, metadata={"help": "sweep multiplier"})
    dtype: str = field(default="float32", metadata={"help": "float32 float16 bfloat16 float64 int32"})
    warmup: int = field(default=5, metadata={"help": "untimed iterations per size"})
    iters: int = field(default=20, metadata={"help": "timed iterations per size"})
    backend: str = field(default="auto", metadata={"help": "auto | gloo | nccl (nccl = RCCL on ROCm)"})

    def __post_init__(self):
        check_range("step_factor", self.step_factor, 2, integer=True, hint="the sweep must grow")
        check_range("warmup", self.warmup, 0, integer=True)
        check_range("iters", self.iters, 1, integer=True)


def _init(backend: str) -> torch.device:
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise RecipeError(f"backend {backend!r}: choose auto, gloo or nccl")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RecipeError("backend nccl needs GPUs; use --backend gloo on CPU")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    else:  # not launched by torchrun / accelerate: a world of one process
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return device


@exit_on_recipe_error
def main(argv=None):
    (args,) = parse_recipe([BenchArguments], argv)
    setup_logging()
    world = int(os.environ.get("WORLD_SIZE", 1))
    sizes = (
        [parse_size(s) for s in args.sizes]
        if args.sizes
        else size_sweep(args.min_bytes, args.max_bytes, args.step_factor)
    )
    validate(args.collectives, args.dtype, sizes, world)  # before any process group exists
    if args.warmup < 0 or args.iters < 1:
        raise RecipeError(f"need warmup >= 0 and iters >= 1, got {args.warmup}, {args.iters}")
    device = _init(args.backend)
    rank = dist.get_rank()

    def progress(r):
        if rank == 0:
            print(
                f"{r.collective:>14} {human(r.size_bytes):>8} {r.time_us:12.1f} us  algbw {r.algbw_gbps:9.3f} GB/s  "
                f"busbw {r.busbw_gbps:9.3f} GB/s  {'ok' if r.correct else 'WRONG RESULT'}",
                flush=True,
            )

    try:
        results = run_sweep(args.collectives, sizes, args.dtype, device, args.warmup, args.iters, progress)
        if rank == 0:
            paths = write_outputs(results, args.output_dir)
            print("wrote", ", ".join(paths.values()))
        wrong = [f"{r.collective} {human(r.size_bytes)}" for r in results if not r.correct]
    finally:
        dist.destroy_process_group()
    if wrong:
        raise RecipeError(f"wrong collective results: {wrong}")


if __name__ == "__main__":
    main()
