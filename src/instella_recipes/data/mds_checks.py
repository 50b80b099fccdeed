"""What an MDS folder is checked for before a run reads it (`data/mds.py` reads it with mosaicml-streaming).

streaming trusts its folders: a shard file that is missing is an error printed from a background thread (the epoch
then ends with no rows, and the run would train 0 steps), a truncated shard or an `index.json` claiming more rows
than a shard holds is a raw traceback mid-run, a halved row count in `index.json` reads half the rows without a
word, a `str` `input_ids` column fails in the collator, and document spans are used as they are. So before any work,
for every shard `index.json` lists (`check_shards`):

- always (a few bytes a shard): the columns and their encodings (`input_ids`, `indices`, `label_mask` integer
  arrays), the shard file present with the size `index.json` records, and the shard's own header (its row count
  and row offsets) agreeing with `index.json` and the file's size;
- within the start-up budget (`INSTELLA_VERIFY_BYTES`, 2 GiB: all of a small data set; the token files' rule,
  `core/manifest.py`): the checksums `index.json` records (streaming's writer records them when given `hashes`;
  ours records xxh3_128), and every row read: token ids within the tokenizer's range, `indices` (start, end) pairs
  sorted, not overlapping, inside the row, `label_mask` as long as the row. Shards over the budget are checked by
  size and row count only, said once in the log; the collator checks each row's spans and ids as it reads it
  (`span_problem`), so a bad row there stops the run with one line (`MDSDataError`).

Our folders also record their row count beside the shards (`mds.TOKENIZER_RECORD`): `index.json` listing another
total (a shard dropped from it) is an error too (`mds.check_mds_folder`). A shard written compressed (`zip_data`)
is checked by its compressed size and checksums, and once streaming has decompressed it beside, the raw file as
above; the compressed file is the one the run's identity hashes.
"""

from pathlib import Path

import numpy as np

from instella_recipes.core import RecipeError, get_logger
from instella_recipes.core.manifest import VERIFY_BYTES

from .integrity import content_digests

logger = get_logger(__name__)

# The columns our collator reads; each an integer array (streaming's NDArray encoding, with or without a fixed
# dtype). Other columns are left alone.
READ_COLUMNS = ("input_ids", "indices", "label_mask")
REDO = "fetch the folder again or write it again (prepare_data --layout mds, or mds.write_mds)"
SHARD_KIND = "mds_streams shard"  # the noun a refused resume names a changed shard with (`describe_data_change`)


class MDSDataError(RecipeError):
    """A problem found in the MDS rows while training (streaming failed to read them, or the collator refused a row
    past the start-up budget). With dataloader workers, torch re-raises a worker's error in the main process as
    `type(error)(<"Caught ... in DataLoader worker" and its traceback as text>)`: the message is then cut back to
    its own last line, so the run still ends with one `error:` line."""

    def __init__(self, message: str):
        if message.startswith("Caught ") and "\nOriginal Traceback" in message:
            message = message.rstrip().splitlines()[-1].partition(": ")[2]
        super().__init__(message)


def check_encodings(index_path: Path, shard: dict) -> None:
    """The shard's `input_ids` (and, when present, `indices`, `label_mask`) are integer arrays."""
    names, encodings = shard.get("column_names") or [], shard.get("column_encodings") or []
    for name, encoding in zip(names, encodings):
        if name not in READ_COLUMNS:
            continue
        kind, _, dtype = str(encoding).partition(":")
        dtype = dtype.partition(":")[0]
        integer = kind == "ndarray" and (not dtype or (_is_dtype(dtype) and np.dtype(dtype).kind in "iu"))
        if not integer:
            raise RecipeError(
                f"mds_streams: {index_path}: shard {_basename(shard)} stores {name} as '{encoding}'; the rows need "
                f"integer arrays (ndarray:uint32, the authors' layout): {REDO}"
            )


def _is_dtype(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:
        return False
    return True


def _basename(shard: dict) -> str:
    return str((shard.get("raw_data") or shard.get("zip_data") or {}).get("basename"))


def _header(path: Path, samples: int, size: int, where: str) -> np.ndarray:
    """The shard's row offsets (its header: the row count, then count + 1 offsets), checked against `index.json`'s
    row count and the file's size."""
    with open(path, "rb") as handle:
        head = handle.read(4)
        count = int(np.frombuffer(head, np.uint32)[0]) if len(head) == 4 else -1
        if count != samples:
            held = f"holds {count} rows" if count >= 0 else "has no header"
            raise RecipeError(f"mds_streams: {where}: index.json says {samples} rows, the shard {held}: {REDO}")
        offsets = np.frombuffer(handle.read(4 * (count + 1)), np.uint32)
    if len(offsets) != count + 1 or offsets[0] < 4 * (count + 2) or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise RecipeError(f"mds_streams: {where}: its row offsets are damaged (not an MDS shard header): {REDO}")
    if int(offsets[-1]) != size:
        raise RecipeError(
            f"mds_streams: {where}: its rows end at byte {int(offsets[-1])}, the file has {size} (truncated or "
            f"appended to): {REDO}"
        )
    return offsets


def _check_hashes(data: bytes, hashes: dict, where: str) -> None:
    from streaming.base.hashing import get_hash, is_hash  # mosaicml-streaming is optional (`mds.import_streaming`)

    for algo, expected in (hashes or {}).items():
        if is_hash(algo) and get_hash(algo, data) != expected:
            raise RecipeError(f"mds_streams: {where}: does not match its {algo} checksum in index.json (its bytes "
                              f"changed after it was written: a bad copy or a disk fault): {REDO}")  # fmt: skip


def span_problem(spans, n: int) -> str | None:
    """What is wrong with a row's `indices` (its documents' (start, end) spans) in a row of `n` tokens, or None:
    pairs only, each start <= end <= n, sorted and not overlapping (the collator would read tokens twice)."""
    spans = np.asarray(spans)
    if spans.size == 0:
        return None
    if spans.dtype.kind not in "iu":
        return f"indices are {spans.dtype} numbers, not token positions"
    if (spans.ndim == 2 and spans.shape[1] != 2) or spans.ndim > 2 or spans.size % 2:
        return f"indices of shape {list(spans.shape)} are not (start, end) pairs"
    pairs = spans.reshape(-1, 2).astype(np.int64)
    starts, ends = pairs[:, 0], pairs[:, 1]
    if np.all(starts <= ends) and np.all(ends <= n) and np.all(starts[1:] >= ends[:-1]):
        return None  # the usual case, without a loop over the spans
    for k, (start, end) in enumerate(pairs.tolist()):
        if end < start:
            return f"indices entry {k} [{start}, {end}] ends before it starts"
        if end > n:
            return f"indices entry {k} [{start}, {end}] ends past the row's {n} tokens"
        if k and start < pairs[k - 1][1]:
            return f"indices entries {k - 1} and {k} overlap or are out of order ({pairs[k - 1].tolist()}, " + (
                f"{[start, end]}): the collator would read those tokens twice"
            )
    return None


def _row_columns(data: bytes, shard: dict) -> dict:
    """The columns our collator reads of one row's bytes (streaming's MDS row layout: the sizes of the columns
    without a fixed size, then each column's bytes), decoded by streaming's encodings."""
    from streaming.base.format.mds.encodings import mds_decode  # optional dependency, as above

    names, encodings, fixed = shard["column_names"], shard["column_encodings"], shard.get("column_sizes")
    fixed = fixed or [None] * len(names)
    idx, sizes = 0, []
    for size in fixed:
        if size:
            sizes.append(size)
        else:
            sizes.append(int(np.frombuffer(data[idx : idx + 4], np.uint32)[0]))
            idx += 4
    out = {}
    for name, encoding, size in zip(names, encodings, sizes):
        if name in READ_COLUMNS:
            out[name] = mds_decode(encoding, data[idx : idx + size])
        idx += size
    return out


def _check_rows(data: bytes, offsets: np.ndarray, shard: dict, vocab_size: int | None, where: str) -> None:
    data, offsets = memoryview(data), offsets.tolist()  # rows sliced without copies
    for i in range(len(offsets) - 1):
        try:
            row = _row_columns(data[offsets[i] : offsets[i + 1]], shard)
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise RecipeError(f"mds_streams: {where} row {i}: cannot be decoded ({err}): {REDO}") from None
        ids = np.asarray(row["input_ids"])
        if ids.dtype.kind not in "iu":
            raise RecipeError(f"mds_streams: {where} row {i}: input_ids are {ids.dtype} numbers, not token ids: "
                              f"{REDO}")  # fmt: skip
        if vocab_size is not None and ids.size and int(ids.max()) >= vocab_size:
            raise RecipeError(
                f"mds_streams: {where} row {i}: token id {int(ids.max())} is beyond the tokenizer's {vocab_size} "
                f"ids: the folder was written with another tokenizer (set tokenizer to that one) or is damaged"
            )
        problem = span_problem(row["indices"], ids.size) if row.get("indices") is not None else None
        if problem:
            raise RecipeError(f"mds_streams: {where} row {i}: {problem}: write the folder again with (start, "
                              f"end) spans sorted, not overlapping, inside the row (mds.pack_rows makes them "
                              f"so)")  # fmt: skip
        mask = row.get("label_mask")
        if mask is not None and np.asarray(mask).size != ids.size:
            raise RecipeError(f"mds_streams: {where} row {i}: label_mask has {np.asarray(mask).size} entries for "
                              f"{ids.size} tokens: {REDO}")  # fmt: skip


class Budget:
    """Bytes of shards still to read in full on this start (hashes and rows), over all folders of a run; what is
    over it is counted for the one warning (`warn`)."""

    def __init__(self, nbytes: int | None = None):
        self.left = VERIFY_BYTES if nbytes is None else nbytes
        self.skipped, self.skipped_bytes = 0, 0

    def take(self, size: int) -> bool:
        if size <= self.left:
            self.left -= size
            return True
        self.skipped, self.skipped_bytes = self.skipped + 1, self.skipped_bytes + size
        return False

    def warn(self) -> None:
        if self.skipped:
            logger.warning(
                f"{self.skipped} MDS shards ({self.skipped_bytes / 2**30:.1f} GiB) were checked by size and row count "
                f"only on this start: reading them in full (checksums, token ids, spans) is over the "
                f"{VERIFY_BYTES / 2**30:.1f} GiB start-up budget (INSTELLA_VERIFY_BYTES; raise it to check them all "
                f"once); the collator still checks each row's spans as it reads it"
            )


def _check_file(path: Path, record: dict, shard: dict | None, vocab_size: int | None, budget: Budget) -> None:
    """One shard file against its `index.json` record (`raw_data` or `zip_data`): its size, and within the budget
    its checksums; a raw shard (`shard` given) also its header and, within the budget, its rows."""
    where = f"{path.parent}: shard {path.name}"
    size = path.stat().st_size
    if record.get("bytes") is not None and size != record["bytes"]:
        raise RecipeError(f"mds_streams: {where} is {size} bytes, index.json says {record['bytes']} (truncated or "
                          f"replaced): {REDO}")  # fmt: skip
    samples = shard.get("samples") if shard is not None else None
    if shard is not None and (not isinstance(samples, int) or samples < 0):
        raise RecipeError(f"mds_streams: {where}: index.json gives its row count as {samples!r}: {REDO}")
    offsets = _header(path, samples, size, where) if shard is not None else None
    if budget.take(size):
        data = path.read_bytes()
        _check_hashes(data, record.get("hashes"), where)
        if offsets is not None:
            _check_rows(data, offsets, shard, vocab_size, where)


def check_shards(folder: Path, index: dict, vocab_size: int | None = None, budget: Budget | None = None) -> list:
    """Every shard of one MDS folder (module docstring), a `RecipeError` naming the folder, shard (and row) and what
    to do at the first problem. Returns the shards' identities for the run's data fingerprint:
    `[path, bytes, content digest, SHARD_KIND]` each (`integrity.content_digests`: a shard rewritten with other
    tokens of the same size differs)."""
    budget = budget or Budget()
    index_path = folder / "index.json"
    files = []
    for shard in index["shards"]:
        check_encodings(index_path, shard)
        raw, packed = shard.get("raw_data") or {}, shard.get("zip_data") or {}
        named = [(folder / str(r.get("basename")), r) for r in (raw, packed) if r]
        present = [(path, r) for path, r in named if path.is_file()]
        if not present:
            name = (raw or packed).get("basename")
            raise RecipeError(f"mds_streams: {folder}: shard {name} (listed in index.json) is missing: {REDO}")
        for path, record in present:  # a compressed shard streaming has decompressed: both files, both checked
            _check_file(path, record, shard if record is raw else None, vocab_size, budget)
        files.append(present[-1][0])  # the compressed file when there is one: it stays as it was written
    return [[str(p), p.stat().st_size, digest, SHARD_KIND] for p, digest in zip(files, content_digests(files))]
