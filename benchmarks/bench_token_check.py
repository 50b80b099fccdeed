"""The token-file content check (`data/integrity.py`) at 1 GB, and extrapolated to stage 1's 2,329 token files.

Measured on one file of `--gib` GiB of random uint16 tokens, page cache warm (a second read of the same file), each
timing the median of `--repeats`:

- full hash: `integrity.full_digest` (xxh3-128 of the file, as manifests record it, plus an xxh3-64 of every 1 MiB
  block for the cache), against the baseline `core.fast_digest` (xxh3-128 alone, what `verify_files` reads) and
  sha256 (hashlib), the usual alternative;
- a cached start: the cache lookup (one stat and one small JSON read) plus `SAMPLE_BYTES` of sampled blocks, for the
  file alone (all its blocks when they fit);
- the resume identity: `integrity.sample_digest` (three 4 KiB reads).

Extrapolation: stage 1 = 2,329 files holding ~4.065T uint16 tokens (SPEC.md section 2) = 8.13 TB, assumed evenly
spread: 3.49 GB a file. The full pass scales with bytes (a cold read is bounded by the disk instead: the table says
the rate it assumes); a cached start costs 2,329 lookups plus `SAMPLE_BYTES` in all; the identity 2,329 x 3 reads.

    PYTHONPATH=. python benchmarks/bench_token_check.py [--gib 1 --repeats 3]
"""

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from instella_recipes.core import fast_digest
from instella_recipes.data import integrity
from instella_recipes.data.integrity import Checked, VerifiedCache, full_digest, sample_digest, verify_contents

FILES = 2329
STAGE1_BYTES = 4.065e12 * 2  # ~4.065T uint16 tokens (SPEC.md section 2)


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def measure(path: Path, repeats: int, cache_dir: Path) -> dict:
    digest, _ = full_digest(path)  # warms the page cache too
    item = Checked(path, path.name, digest)
    cache = VerifiedCache(cache_dir)
    verify_contents([item], budget=path.stat().st_size, cache=cache)  # fills the cache
    return {
        "load": os.getloadavg()[0],
        "bytes": path.stat().st_size,
        "full": _median(lambda: full_digest(path), repeats),
        "xxh3": _median(lambda: fast_digest(path), repeats),
        "sha256": _median(lambda: _sha256(path), repeats),
        "cached": _median(lambda: verify_contents([item], budget=0, cache=cache), repeats),
        "lookup": _median(lambda: cache.get(path), repeats * 30),
        "identity": _median(lambda: sample_digest(path), repeats * 10),
    }


def report(r: dict) -> str:
    gb = r["bytes"] / 1e9
    per_file = STAGE1_BYTES / FILES
    rate = r["bytes"] / r["full"]  # bytes/s of one process hashing from page cache
    disk, workers = 2e9, 16  # assumed: 2 GB/s read per node (one NVMe, or a share of Lustre), 16 hashing processes

    def hours(processes: int) -> float:  # bounded by the CPUs or by the disk, whichever is slower
        return STAGE1_BYTES / min(rate * processes, disk) / 3600

    # a cache record holds one digest per 1 MiB block: a stage-1 file's is per_file / bytes times larger to parse
    lookup = r["lookup"] * max(1.0, per_file / r["bytes"])
    stage1_cached = FILES * lookup + integrity.SAMPLE_BYTES / rate
    return f"""
One {gb:.2f} GB token file (random uint16), page cache warm, median of repeats, one process (load average
{r["load"]:.1f} on {os.cpu_count()} CPUs when it started: on a busy machine the rates are lower). Stage 1 extrapolation:
{FILES} files, ~4.065T tokens = {STAGE1_BYTES / 1e12:.2f} TB, assumed evenly spread ({per_file / 1e9:.2f} GB a file),
read at an assumed {disk / 1e9:.0f} GB/s per node when not in memory.

| check | 1 GB file | ratio to our full hash | stage 1 ({FILES} files) |
| --- | --- | --- | --- |
| full hash, ours (`full_digest`: xxh3-128 + 1 MiB block digests) | {r["full"] / gb:.3f} s/GB | 1.00 | {hours(1):.2f} h on one process, {hours(workers):.2f} h with `verify_data.py --workers {workers}` on one node (once, then cached) |
| baseline: xxh3-128 alone (`fast_digest`, what manifests record) | {r["xxh3"] / gb:.3f} s/GB | {r["xxh3"] / r["full"]:.2f} | {STAGE1_BYTES / min(r["bytes"] / r["xxh3"], disk) / 3600:.2f} h on one process |
| baseline: sha256 (hashlib) | {r["sha256"] / gb:.3f} s/GB | {r["sha256"] / r["full"]:.2f} | {STAGE1_BYTES / min(r["bytes"] / r["sha256"], disk) / 3600:.2f} h on one process |
| every start, cached file: lookup (stat + JSON of its block digests) | {r["lookup"] * 1e3:.2f} ms | {r["lookup"] / r["full"]:.5f} | {FILES * lookup:.1f} s (the lookup scaled to {per_file / 1e9:.2f} GB files) |
| every start, cached file: lookup + up to {integrity.SAMPLE_BYTES >> 20} MiB of sampled blocks | {r["cached"] * 1e3:.1f} ms | {r["cached"] / r["full"]:.4f} | {stage1_cached:.1f} s ({FILES} lookups + {integrity.SAMPLE_BYTES >> 20} MiB in all) |
| resume identity (`sample_digest`: 3 x 4 KiB) | {r["identity"] * 1e6:.0f} us | {r["identity"] / r["full"]:.6f} | {FILES * r["identity"]:.2f} s from memory ({FILES * 3} reads; cold: their latency) |

A full hash on every start would cost stage 1 the first row's time on each start; with the cache it is paid once per
file (again only for a file that changed), and every start costs the last two rows.
"""  # noqa: E501


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the measured file in GiB")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no_record", action="store_true", help="print only; do not write benchmarks/RESULTS.md")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "part-00-00000.npy"
        rng = np.random.default_rng(0)
        tokens = int(args.gib * 2**30) // 2
        with open(path, "wb") as handle:
            for start in range(0, tokens, 1 << 26):
                rng.integers(0, 50280, min(1 << 26, tokens - start), dtype="<u2").tofile(handle)
        body = report(measure(path, args.repeats, Path(tmp) / "cache"))
    print(body)
    if not args.no_record:
        from benchmarks.results_io import record  # only when recording: the table needs torch for the machine line

        record("token_check", "Token-file content check: full hash once, sampled blocks on every start", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
