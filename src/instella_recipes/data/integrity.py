"""Content checks of token files that scale to stage 1's 2,329 files (~8 TB): what `pretrain --data_paths` and a
re-run of `prepare_data --layout olmo` check before any work, and what `scripts/verify_data.py` checks in full.

A manifest written by `prepare_data` records each token file's xxh3-128 checksum. Hashing every file on every start
would read the whole data set each time (hours at stage 1's scale; benchmarks/bench_token_check.py), so:

1. a file is hashed in full once, and the result cached outside the data folder (which may be read-only), keyed by
   what any rewrite changes: device, inode, size, modification and change times (`VerifiedCache`). The cache entry
   also keeps the xxh3-64 digest of every `BLOCK` bytes;
2. every start re-reads `SAMPLE_BYTES` (64 MiB) of cached files in blocks chosen at random and compares them with
   the cached block digests: all of a small data set; for a large one a spot check of damage that kept the file's
   times (a disk fault, a copy tool restoring mtimes), which over many starts reads more of it;
3. files not yet in the cache are hashed in full at start while they add up to no more than `VERIFY_BYTES`
   (2 GiB: all of a small data set); above that, start-up checks their sizes only and says so, and
   `scripts/verify_data.py` hashes them all once (in parallel) and fills the cache.

A run's data identity (`sample_digest`, for resume checks) reads three small blocks of each file: a file rewritten
with other tokens of the same size gives another identity, whether or not a manifest describes it. MDS shards and
post-training `sources` files (`content_digests`) are hashed in full up to `IDENTITY_FULL_BYTES` in all, then sampled
the same way.
"""

import bisect
import itertools
import json
import os
import random
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import xxhash

from instella_recipes.core import MANIFEST, RecipeError, get_logger, read_manifest, require_complete, verify_files
from instella_recipes.core.manifest import HASH, VERIFY_BYTES

logger = get_logger(__name__)

BLOCK = 1 << 20  # bytes per cached block digest: a 3.5 GB token file has 3,338 (53 KB of cache)
# Bytes of cached files re-read on every start, in random blocks over all of them: all of a small data set, a spot
# check of a large one (stage 1: 64 of its ~7.8 million blocks a start, ~40 ms from page cache).
SAMPLE_BYTES = int(os.environ.get("INSTELLA_SAMPLE_BYTES", 64 << 20))
_READ = 8 << 20  # read size while hashing (a multiple of BLOCK)
_SAMPLE = 4096  # bytes of each of the three identity blocks (`sample_digest`)


@dataclass
class Checked:
    """One token file to check: its path, how to name it in an error, and the checksum its manifest records."""

    path: Path
    name: str
    digest: str | None = None
    redo: str = "write it again"


def sample_digest(path: Path) -> str:
    """xxh3-128 of the file's size and its first, middle and last `_SAMPLE` bytes: three reads a file, enough to tell
    a file rewritten with other tokens from the one a run started on (not a single flipped byte: see the module)."""
    size = path.stat().st_size
    digest = xxhash.xxh3_128(str(size).encode())
    with open(path, "rb") as handle:
        for start in sorted({0, max(0, size // 2 - _SAMPLE // 2), max(0, size - _SAMPLE)}):
            handle.seek(start)
            digest.update(handle.read(_SAMPLE))
    return digest.hexdigest()


# A run's identity hashes its MDS shards and `sources` files in full while they add up to this many bytes (about a
# second), then samples the rest (`sample_digest`): fixed, so the identity of the same files never changes.
IDENTITY_FULL_BYTES = 1 << 30


def content_digests(paths: list[Path]) -> list[str]:
    """Content identities of a run's data files (MDS shards, `sources` files) for resume checks: xxh3-128 of each
    whole file while they add up to `IDENTITY_FULL_BYTES` (a change anywhere in a small data set is seen), then
    `sample_digest` (three blocks a file: a file rewritten with other data)."""
    out, left = [], IDENTITY_FULL_BYTES
    for path in paths:
        size = path.stat().st_size
        if size <= left:
            left -= size
            out.append(full_digest(path)[0])
        else:
            out.append(sample_digest(path))
    return out


def full_digest(path: str | Path) -> tuple[str, list[str]]:
    """(xxh3-128 of the whole file, as manifests record it; xxh3-64 of each `BLOCK` bytes) in one pass, reading
    into one reused buffer (no allocation per read)."""
    whole, blocks = xxhash.xxh3_128(), []
    buffer = bytearray(_READ)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while True:
            filled = 0
            while filled < _READ and (n := handle.readinto(view[filled:])):
                filled += n
            if not filled:
                break
            whole.update(view[:filled])
            blocks += [xxhash.xxh3_64(view[i : min(i + BLOCK, filled)]).hexdigest() for i in range(0, filled, BLOCK)]
            if filled < _READ:
                break
    return whole.hexdigest(), blocks


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


class VerifiedCache:
    """Full-hash results of token files, one small JSON file per token file under `cache_dir` (default
    `$INSTELLA_CACHE_DIR/verified`, else `~/.cache/instella_recipes/verified`), valid while the file's device, inode,
    size, mtime and ctime are those it was hashed with. A cache that cannot be written is skipped (each start then
    hashes again within the budget)."""

    def __init__(self, cache_dir: str | Path | None = None):
        if cache_dir is None:
            base = os.environ.get("INSTELLA_CACHE_DIR") or Path.home() / ".cache" / "instella_recipes"
            cache_dir = Path(base) / "verified"
        self.dir = Path(cache_dir)

    def _file(self, path: Path) -> Path:
        return self.dir / f"{xxhash.xxh3_128(str(path.resolve()).encode()).hexdigest()}.json"

    def get(self, path: Path) -> dict | None:
        """The cached record of `path` while the file is unchanged (None otherwise)."""
        try:
            record = json.loads(self._file(path).read_text())
        except (OSError, ValueError):
            return None
        return record if record.get("stat") == _stat_key(path) and record.get("path") == str(path.resolve()) else None

    def put(self, path: Path, digest: str, blocks: list[str], stat: list[int]) -> None:
        record = {"path": str(path.resolve()), "stat": stat, HASH: digest, "block_size": BLOCK, "blocks": blocks}
        try:  # a temporary name of its own: every rank of a node may record the same file at once
            self.dir.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile("w", dir=self.dir, suffix=".partial", delete=False) as handle:
                handle.write(json.dumps(record) + "\n")
            os.replace(handle.name, self._file(path))
        except OSError as err:
            logger.debug(f"token check cache {self.dir} not written: {err}")

    def drop(self, path: Path) -> None:
        self._file(path).unlink(missing_ok=True)


def _mismatch(item: Checked, where: str = "") -> RecipeError:
    return RecipeError(
        f"{item.name} does not match the checksum in the {MANIFEST} beside it{where} (its bytes changed after it was "
        f"written: a bad copy or a disk fault): {item.redo}"
    )


def _check_sampled_blocks(cached: list[tuple[Checked, dict]], rng: random.Random, budget: int, cache) -> None:
    """Re-read `budget` bytes of `cached` files in random whole blocks (every block when they fit) and compare each
    with its cached digest. Blocks are numbered over all files and drawn by number (stage 1 has ~7.8 million: none
    of them listed)."""
    starts = list(itertools.accumulate((len(record["blocks"]) for _, record in cached), initial=0))
    total, count = starts[-1], max(1, budget // BLOCK)
    numbers = range(total) if total <= count else sorted(rng.sample(range(total), count))
    for number in numbers:
        n = bisect.bisect_right(starts, number) - 1
        item, record = cached[n]
        b = number - starts[n]
        with open(item.path, "rb") as handle:
            handle.seek(b * record["block_size"])
            if xxhash.xxh3_64(handle.read(record["block_size"])).hexdigest() != record["blocks"][b]:
                cache.drop(item.path)
                raise _mismatch(item, f" (block {b} of {len(record['blocks'])})")


def _hash_and_stat(path: str) -> tuple[str, list[str], list[int]]:
    stat = _stat_key(Path(path))  # before reading: a write during the pass leaves a key that no longer matches
    digest, blocks = full_digest(path)
    return digest, blocks, stat


def verify_contents(items: list[Checked], budget: int | None = None, cache: VerifiedCache | None = None,
                    workers: int = 1) -> list[Checked]:  # fmt: skip
    """Check each item that carries a recorded checksum: sampled blocks of files the cache has hashed, a full hash
    of the others while they add up to `budget` bytes (default `VERIFY_BYTES`; None-budget callers that want all
    pass a huge one). A mismatch is a `RecipeError` naming the file. Returns the items left unchecked (over budget)."""
    cache = cache or VerifiedCache()
    budget = VERIFY_BYTES if budget is None else budget
    cached, todo = [], []
    for item in (i for i in items if i.digest):
        record = cache.get(item.path)
        if record is not None and record.get(HASH) == item.digest and record.get("block_size") == BLOCK:
            cached.append((item, record))
        else:
            todo.append(item)
    # other blocks on every start: over several starts, more of each file is read
    _check_sampled_blocks(cached, random.Random(), SAMPLE_BYTES, cache)
    hashed, left = [], []
    for item in todo:
        size = item.path.stat().st_size
        (hashed if size <= budget else left).append(item)
        budget -= size if size <= budget else 0
    with ProcessPoolExecutor(workers) if workers > 1 else _Inline() as pool:
        for item, (digest, blocks, stat) in zip(hashed, pool.map(_hash_and_stat, [str(i.path) for i in hashed])):
            if digest != item.digest:
                raise _mismatch(item)
            cache.put(item.path, digest, blocks, stat)
    return left


class _Inline:
    """`ProcessPoolExecutor`'s `map` in this process (one worker: no processes to start)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def map(self, fn, values):
        return map(fn, values)


def warn_unverified(left: list[Checked], command: str) -> None:
    """One warning for files only checked by size on this start, with the command that checks them once."""
    if left:
        gib = sum(i.path.stat().st_size for i in left) / 2**30
        logger.warning(
            f"{len(left)} token files ({gib:.1f} GiB) were checked by size only on this start (a full hash is over "
            f"the {VERIFY_BYTES / 2**30:.1f} GiB start-up budget, INSTELLA_VERIFY_BYTES); hash them once with "
            f"`{command}`, and later starts check sampled blocks of them"
        )


def verify_folder(folder: Path, manifest: dict, what: str, command: str) -> None:
    """Every file `manifest` lists is in `folder` with its size (`verify_files`) and, as far as `verify_contents`
    checks at start-up, its checksum; a `RecipeError` naming the file otherwise. `command` (which checks the rest
    in full) goes into the warning about files over the start-up budget."""
    verify_files(folder, manifest, what, hash_bytes=0)
    listed = (manifest.get("integrity") or {}).get("files") or {}
    redo = f"run the '{manifest.get('stage', '?')}' stage again with --overwrite true"
    items = [
        Checked(folder / name, f"{what} {folder}: {name}", entry.get(HASH), redo) for name, entry in listed.items()
    ]
    warn_unverified(verify_contents(items), command)


def require_verified(folder: str | Path, what: str) -> dict:
    """`core.require_complete` with the checksums checked the scalable way (`verify_folder`: the cache, sampled
    blocks, a full hash of what is new up to the start-up budget) instead of in full on every start up to it."""
    manifest = read_manifest(folder)
    if manifest is None:
        return require_complete(folder, what)  # its error: not a finished stage output
    verify_folder(Path(folder), manifest, what, f"python scripts/verify_data.py --folders {folder}")
    return manifest
