"""Collective-communication microbenchmarks with nccl-tests' conventions (SPEC.md 5).

For each collective and message size S (bytes): warm-up iterations, then timed iterations; the time t is the mean
per iteration of the slowest rank (max over ranks, as a collective is only done when every rank is done).
algbw = S / t; busbw = algbw x factor, the factor making busbw comparable with the link speed whatever n is:

| collective | S means | busbw factor |
|---|---|---|
| all_reduce | the tensor on every rank | 2(n-1)/n |
| reduce_scatter | the total (input) size; each rank keeps S/n | (n-1)/n |
| all_gather | the total (output) size; each rank sends S/n | (n-1)/n |
| broadcast | the tensor | 1 |
| all_to_all | the total sent by one rank (S/n to each peer) | (n-1)/n |

Every size is first run once on known data and the result is checked exactly on every rank (values are small
integers, exact in every supported dtype), so a wrong result is an error, not a fast number.
torch.distributed is the library here; what it lacks (and nccl-tests has, but only for NCCL/RCCL) is one tool that
works the same with gloo on CPU and NCCL/RCCL on GPUs, driven from Python.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.distributed as dist

from instella_recipes.core import RecipeError, check_range, exit_on_recipe_error, parse_recipe, setup_logging

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all")
DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int32": torch.int32,
}
_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024**2, "MB": 1024**2, "MIB": 1024**2}
_UNITS |= {"G": 1024**3, "GB": 1024**3, "GIB": 1024**3}


def bus_factor(collective: str, world_size: int) -> float:
    n = world_size
    return {"all_reduce": 2 * (n - 1) / n, "broadcast": 1.0}.get(collective, (n - 1) / n)


def parse_size(text: str | int) -> int:
    """'1K' / '4MiB' / '1G' / 1024 -> bytes (binary units, as nccl-tests)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(text))
    if not match or match.group(2).upper() not in _UNITS:
        raise RecipeError(f"message size {text!r} is not a size like 1024, 64K, 4MiB or 1G")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def size_sweep(min_bytes: str | int, max_bytes: str | int, factor: int) -> list[int]:
    low, high = parse_size(min_bytes), parse_size(max_bytes)
    if low <= 0 or high < low or factor < 2:
        raise RecipeError(f"need 0 < min_bytes <= max_bytes and step_factor >= 2, got {low}, {high}, {factor}")
    sizes = []
    while low <= high:
        sizes.append(low)
        low *= factor
    return sizes


def human(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return f"{size}B"


def validate(collectives: list[str], dtype: str, sizes: list[int], world_size: int) -> torch.dtype:
    """Refuse bad input before any communication: unknown collective/dtype, sizes the layout cannot split."""
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise RecipeError(f"unsupported collective(s) {unknown}: choose from {list(COLLECTIVES)}")
    if dtype not in DTYPES:
        raise RecipeError(f"unsupported dtype {dtype!r}: choose from {list(DTYPES)}")
    element = torch.tensor([], dtype=DTYPES[dtype]).element_size()
    for size in sizes:
        if size % element:
            raise RecipeError(f"message size {size} bytes is not a multiple of the {dtype} element size ({element})")
        for collective in set(collectives) - {"all_reduce", "broadcast"}:
            if (size // element) % world_size:
                raise RecipeError(
                    f"{collective}: message size {size} bytes ({size // element} {dtype} elements) is not divisible "
                    f"by the world size {world_size}; pick sizes that are multiples of {element * world_size} bytes"
                )
    return DTYPES[dtype]


@dataclass
class Result:
    collective: str
    backend: str
    world_size: int
    dtype: str
    size_bytes: int
    iters: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    correct: bool

    def as_dict(self) -> dict:
        return asdict(self)


class _Op:
    """Buffers and call for one collective at one size; `check()` validates the result of a fresh run."""

    def __init__(self, collective: str, size: int, dtype: torch.dtype, device: torch.device):
        self.collective, self.dtype = collective, dtype
        self.rank, self.n = dist.get_rank(), dist.get_world_size()
        count = size // torch.tensor([], dtype=dtype).element_size()
        self.count = count
        make = lambda numel: torch.empty(numel, dtype=dtype, device=device)  # noqa: E731
        if collective in ("all_reduce", "broadcast"):
            self.input, self.output = make(count), None
        elif collective == "reduce_scatter":
            self.input, self.output = make(count), make(count // self.n)
        elif collective == "all_gather":
            self.input, self.output = make(count // self.n), make(count)
        else:  # all_to_all
            self.input, self.output = make(count), make(count)

    def _reduces(self) -> bool:
        return self.collective in ("all_reduce", "reduce_scatter")

    def value(self, rank: int, chunk: int) -> int:
        """What `rank` puts in its `chunk`: small integers that identify the source and stay exact in bf16 (<= 256)
        for reductions over up to 73 ranks and for data movement over any number of ranks."""
        if self._reduces():
            return 1 + rank % 2 + 2 * (chunk % 2)
        return 1 + rank % 64 + 2 * (chunk % 8)

    def fill(self) -> None:
        chunks = self.input.view(self._chunks(), -1)
        for j in range(chunks.shape[0]):
            chunks[j].fill_(self.value(self.rank, j))

    def _chunks(self) -> int:
        return self.n if self.collective in ("reduce_scatter", "all_to_all") else 1

    def run(self) -> None:
        if self.collective == "all_reduce":
            dist.all_reduce(self.input)
        elif self.collective == "broadcast":
            dist.broadcast(self.input, src=0)
        elif self.collective == "reduce_scatter":
            dist.reduce_scatter_single(self.output, self.input)
        elif self.collective == "all_gather":
            dist.all_gather_single(self.output, self.input)
        else:
            dist.all_to_all_single(self.output, self.input)

    def expected(self) -> torch.Tensor:
        n, r = self.n, self.rank
        per = self.count // self._chunks() if self.collective != "all_gather" else self.count // n
        if self.collective == "all_reduce":
            return torch.full((self.count,), float(sum(self.value(s, 0) for s in range(n))), dtype=torch.float64)
        if self.collective == "broadcast":
            return torch.full((self.count,), float(self.value(0, 0)), dtype=torch.float64)
        if self.collective == "reduce_scatter":  # rank r keeps chunk r summed over ranks
            return torch.full((per,), float(sum(self.value(s, r) for s in range(n))), dtype=torch.float64)
        if self.collective == "all_gather":  # chunk s of the output = rank s's input
            values = [self.value(s, 0) for s in range(n)]
        else:  # all_to_all: chunk s of the output = rank s's chunk r
            values = [self.value(s, r) for s in range(n)]
        return torch.tensor(values, dtype=torch.float64).repeat_interleave(per)

    def check(self) -> bool:
        self.fill()
        self.run()
        got = (self.output if self.output is not None else self.input).double().cpu()
        expected = self.expected()
        if self.dtype in (torch.float16, torch.bfloat16) and expected.abs().max() > 256:
            # Beyond 256, 16-bit partial sums round (reductions over > 73 ranks): allow one bf16 ulp per doubling.
            return bool(torch.allclose(got, expected, rtol=2**-7 * max(1, self.n).bit_length(), atol=0))
        return bool(torch.equal(got, expected))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_one(collective, size, dtype_name, device, warmup, iters) -> Result:
    dtype = DTYPES[dtype_name]
    op = _Op(collective, size, dtype, device)
    correct = op.check()
    flag = torch.tensor([1.0 if correct else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)  # correct only if correct on every rank
    for _ in range(warmup):
        op.run()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        op.run()
    _sync(device)
    elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds = elapsed.item() / iters
    algbw = size / seconds / 1e9
    return Result(
        collective,
        dist.get_backend(),
        dist.get_world_size(),
        dtype_name,
        size,
        iters,
        seconds * 1e6,
        algbw,
        algbw * bus_factor(collective, dist.get_world_size()),
        bool(flag.item() == 1.0),
    )


def run_sweep(collectives, sizes, dtype_name, device, warmup, iters, progress=None) -> list[Result]:
    results = []
    for collective in collectives:
        for size in sizes:
            results.append(bench_one(collective, size, dtype_name, device, warmup, iters))
            if progress:
                progress(results[-1])
    return results


def write_outputs(results: list[Result], output_dir) -> dict[str, str]:
    """results.csv, results.json and busbw.png (bus bandwidth vs message size, one line per collective)."""
    import csv
    import json
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = [r.as_dict() for r in results]
    paths = {"csv": out / "results.csv", "json": out / "results.json", "png": out / "busbw.png"}
    tmp = {key: path.with_name(path.name + ".tmp") for key, path in paths.items()}
    with open(tmp["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp["json"].write_text(json.dumps(rows, indent=1))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for collective in dict.fromkeys(r.collective for r in results):
        points = [r for r in results if r.collective == collective]
        ax.plot([r.size_bytes for r in points], [r.busbw_gbps for r in points], marker="o", label=collective)
    first = results[0]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{first.backend}, {first.world_size} processes, {first.dtype}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(tmp["png"], format="png", dpi=110)
    plt.close(fig)
    for key, path in paths.items():
        tmp[key].replace(path)
    return {key: str(path) for key, path in paths.items()}


def markdown_table(results: list[Result]) -> str:
    lines = ["| collective | size | time (us) | algbw (GB/s) | busbw (GB/s) | correct |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(
            f"| {r.collective} | {human(r.size_bytes)} | {r.time_us:.1f} | {r.algbw_gbps:.4g} | {r.busbw_gbps:.4g} "
            f"| {'yes' if r.correct else 'NO'} |"
        )
    return "\n".join(lines)


# --- the benchmark (scripts/bench_collectives.py) -------------------------------------------------------------------
@dataclass
class BenchCollectivesArguments:
    """The settings of `scripts/bench_collectives.py`."""

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


def init_process_group(backend: str) -> torch.device:
    """Join the launcher's process group (torchrun / accelerate), or make a world of one; returns this rank's
    device. `auto` is NCCL (RCCL on ROCm) when GPUs are visible, gloo otherwise."""
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
def main(argv: list[str] | None = None) -> None:
    """`scripts/bench_collectives.py`: every rank runs the sweep; rank 0 prints and writes the results."""
    (args,) = parse_recipe([BenchCollectivesArguments], argv)
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
    device = init_process_group(args.backend)
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
