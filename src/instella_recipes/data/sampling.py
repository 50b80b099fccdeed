"""Seeded samples of a `layout: olmo` source: a fraction of its documents, or a number of its input files.

The authors trained stage 2 on parts of five subsets, chosen by code they did not publish; their
`scripts/prepare_pretrain_data_stage2.sh` says only "we randomly select 3.23% of dclm data", 50% of flan, 5.3% of
pes2o ("of flan data", a slip: the comment sits above the pes2o call), 50% of python-edu, and their configs list 351
of the dm_maths token files. A source's `sample` reconstructs that:

- `{fraction: p}`: every document (input line) is kept with probability p, decided by a keyed hash of
  (seed, source name, the file's path under the source folder, line number). The decision needs no other line, so it
  is the same whatever the grouping, worker count or resume point, and the same for a copy of the inputs elsewhere;
  dropped lines are not parsed or tokenised. The result is what `dolma tokens` writes over the input files with the
  other lines removed. Kept documents are p of the documents seen, and p of their tokens in expectation (the
  manifest records the rows and characters seen and kept).
- `{files: n}`: n of the input files, drawn with `random.Random(f"{seed}-{name}")` from the sorted list, then
  tokenised as usual (with `files_per_process: 1` each file is its own group, hence one token file, as each of the
  authors' dm_maths files is: `part-NNNN-00000.npy`, every one the only file of its group).
"""

import hashlib
import os
import random
from dataclasses import dataclass

from instella_recipes.core import RecipeError, check_range

_SPAN = 1 << 64  # the keyed hash is a uniform 64-bit number; a line is kept when it falls below fraction x 2**64


@dataclass(frozen=True)
class DocumentSample:
    """`{fraction: p}` of one source: which lines of its input files are kept (picklable for worker processes)."""

    fraction: float
    seed: int
    source: str
    base: str  # the folder the source's files are named under (so a moved copy keeps the same sample)

    def selector(self, path: str):
        """`keep(line_number) -> bool` for one input file."""
        if self.fraction >= 1.0:
            return lambda loc: True
        name = os.path.relpath(path, self.base) if self.base else os.path.basename(path)
        prefix = hashlib.blake2b(f"{self.seed}\0{self.source}\0{name}\0".encode(), digest_size=8)
        limit = int(self.fraction * _SPAN)

        def keep(loc: int) -> bool:
            digest = prefix.copy()
            digest.update(loc.to_bytes(8, "little"))
            return int.from_bytes(digest.digest(), "little") < limit

        return keep


def check_sample(name: str, sample) -> dict | None:
    """The `sample` of source `name` as a checked mapping, or None; a `RecipeError` naming the source otherwise."""
    if sample is None:
        return None
    shape = "sample must be {fraction: p} (0 < p <= 1: that share of the documents) or {files: n} (n input files)"
    if not isinstance(sample, dict) or len(sample) != 1 or next(iter(sample)) not in ("fraction", "files"):
        raise RecipeError(f"source '{name}': {shape}, got {sample!r}")
    ((key, value),) = sample.items()
    if key == "fraction":
        check_range(f"source '{name}': sample.fraction", value, 0, 1, low_open=True)
        return {"fraction": float(value)}
    check_range(f"source '{name}': sample.files", value, 1, integer=True)
    return {"files": value}


def sample_files(name: str, files: list[str], count: int, seed: int) -> list[str]:
    """`count` of `files`, drawn with `random.Random(f"{seed}-{name}")` from the sorted list, in sorted order."""
    if count > len(files):
        raise RecipeError(
            f"source '{name}': sample.files is {count}, but only {len(files)} input files match its path and "
            f"data_files: lower sample.files or add the missing files"
        )
    return sorted(random.Random(f"{seed}-{name}").sample(sorted(files), count))
