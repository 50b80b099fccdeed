"""OLMo token files as `dolma tokens` writes them: what the authors trained Instella on (SPEC.md 2.2).

The authors tokenised every pretraining subset with `dolma tokens` (`scripts/prepare_pretrain_data_stage{1,2}.sh`)
and trained on the `.npy` files it wrote. Their README says `pip install dolma` with no version; the releases of
that time (1.0.14 to 1.1.2, Sep 2024 - Feb 2025; 1.2.0 came after Instella's release) share one tokeniser code
path, and this module writes what that path writes, byte for byte (tests/unit/data/test_dolma_tokens.py runs dolma
1.1.2 from PyPI as the oracle). Written here rather than called because dolma pins tokenizers<=0.19.1 and numpy<2,
which this project's stack cannot install beside it.

What dolma does, and so what this does:
- Input: jsonl files (gzip/zstd/bz2/xz by extension), one JSON object a line with a string `id` and a string
  `text` (dolma 1.1's `InputSpec`: `source`, `created` and `added` must be strings and `version` a string or null
  when present). A row that breaks this is skipped (dolma logs a warning and goes on); so is a row whose
  `text.strip()` is empty. The stripped text is what is tokenised.
- Tokens: the text with no special tokens added, then EOS appended unless the last id already is EOS (a text that
  ends in a literal `<|endoftext|>` keeps its one EOS); no BOS. uint16 for a vocabulary of at most 65,536 ids.
- Files: the input paths (patterns expanded, in order) are shuffled and cut into `processes` groups (fewer when
  there are fewer files; `files_per_process` caps a group); group g writes `part-{g}-{k:05d}.npy` (g zero-padded to
  the digits of the group count + 1) plus a `.csv.gz` beside it (start, end, id, src, loc per document).
- Order inside a group: up to `ring_size` files are open at once, documents are taken round robin, every
  `batch_size` of them are shuffled together and appended to the current file; a file holds fewer than `max_size`
  tokens (`max_size` is a token count, though dolma's help calls it bytes), and the documents of a batch that do not
  fit start the next file, in their shuffled order.

Randomness: dolma accepts `--seed` but never seeds anything on this path (`MemMapParallelWriter.__call__` overrides
the base `__call__` that calls `random.seed`, and each worker process starts from OS entropy), so no run of it, the
authors' included, can be replayed. Here the path shuffle uses `random.Random(seed)` and group g's batches
`random.Random(f"{seed}-{g}")`: with those two seeds put into dolma's own `random` module (the test does this),
dolma writes exactly these bytes. Groups are independent, so they run in parallel and resume one by one.

Where dolma 1.1 silently loses data we stop with an error instead: a batch whose leftover does not fit in one new
file (dolma drops the rest), a document of `max_size` tokens or more (dropped), a group with no document at all
(dolma leaves a file of `max_size` zero tokens), a file that is not UTF-8 (dolma drops the rest of the file).

Beyond dolma: a source's document sample (`sampling.DocumentSample`) drops lines before they are parsed, which
writes what dolma writes over the inputs without those lines; and every file's xxh3-128 checksum is computed as it
is written, for the manifest (nothing is read back).
"""

import csv
import gzip
import io
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from glob import glob
from pathlib import Path
from typing import NamedTuple

import fsspec
import numpy as np

from instella_recipes.core import FileHasher, RecipeError, get_logger

DOLMA_MAX_SIZE = 1024 * 1024 * 1024  # dolma's --max_size default (tokens per file)
DOLMA_BATCH_SIZE = 10_000  # dolma's --batch_size default: documents shuffled together
DOLMA_RING_SIZE = 8  # dolma's --ring_size default: files read at once
_OPTIONAL_STRINGS = ("source", "created", "added")  # dolma 1.1 InputSpec fields with a str default

logger = get_logger(__name__)


@dataclass(frozen=True)
class DolmaTokensArguments:
    """`dolma tokens` options that decide the output (the authors set `max_size`, `processes` and `seed`)."""

    max_size: int = DOLMA_MAX_SIZE
    processes: int = 1
    batch_size: int = DOLMA_BATCH_SIZE
    ring_size: int = DOLMA_RING_SIZE
    files_per_process: int | None = None
    seed: int = 0


class Document(NamedTuple):
    id: str
    src: str
    loc: int  # 1-based line number in src
    text: str  # stripped


class Tokenized(NamedTuple):
    id: str
    src: str
    loc: int
    tokens: list[int]


@dataclass
class ReadStats:
    """Rows a group skipped, as dolma skips them: empty text, or not a valid dolma row (with examples); and the lines
    (and their characters) read and left out by a document sample."""

    empty: int = 0
    invalid: int = 0
    examples: list[str] = field(default_factory=list)
    lines: int = 0
    chars: int = 0
    sampled_out_lines: int = 0
    sampled_out_chars: int = 0

    def skip(self, where: str, why: str) -> None:
        self.invalid += 1
        if len(self.examples) < 5:
            self.examples.append(f"{where}: {why}")


def expand_documents(patterns: list[str]) -> list[str]:
    """The input files: each pattern's matches in sorted order (a folder stands for every file in it), pattern
    after pattern. dolma globs the same way (its authors' shell scripts pass the shell's sorted expansion)."""
    out = []
    for pattern in patterns:
        matches = sorted(glob(pattern)) if any(c in pattern for c in "*?[") else [pattern]
        if not matches or not any(Path(m).exists() for m in matches):
            logger.warning(f"no input files match {pattern} (dolma warns and goes on; so do we)")
        for match in matches:
            path = Path(match)
            if path.is_dir():
                out += sorted(str(p) for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
            elif path.is_file():
                out.append(match)
    if not out:
        raise RecipeError(f"no input files match {patterns}: check the paths (and data_files) of the source")
    return out


def group_paths(paths: list[str], settings: DolmaTokensArguments) -> list[list[str]]:
    """dolma's grouping: shuffle the paths, then step through them `len / processes` at a time (capped by
    `files_per_process`), rounding each boundary, dropping empty slices. Each group becomes one `part-{g}`."""
    paths = list(paths)
    random.Random(settings.seed).shuffle(paths)
    step = min(settings.files_per_process or float("inf"), len(paths) / settings.processes)
    groups, current = [], 0.0
    while current < len(paths):  # float steps and round() exactly as dolma's executor
        piece = paths[int(round(current)) : int(round(current + step))]
        if piece:
            groups.append(piece)
        current += step
    return groups


def part_prefix(group: int, num_groups: int) -> str:
    """`part-{g}` with g zero-padded to ceil(log10(num_groups + 1)) digits, as dolma names its outputs."""
    digits = int(math.ceil(math.log10(num_groups + 1)))
    return f"part-{group:0{digits}d}"


def _reject_constant(name: str):
    raise ValueError(f"{name} is not JSON")  # msgspec, dolma's parser, refuses NaN / Infinity


def parse_row(line: str) -> tuple[str, str] | str:
    """`(id, text)` of a line dolma 1.1 accepts, else why it skips it."""
    try:
        row = json.loads(line, parse_constant=_reject_constant)
    except ValueError:
        return "not a JSON object"
    if not isinstance(row, dict):
        return "not a JSON object"
    doc_id, text = row.get("id"), row.get("text")
    if not isinstance(doc_id, str):
        return "no string 'id'"
    if not isinstance(text, str):
        return "no string 'text'"
    for key in _OPTIONAL_STRINGS:
        if key in row and not isinstance(row[key], str):
            return f"'{key}' is not a string"
    if row.get("version") is not None and not isinstance(row["version"], str):
        return "'version' is neither a string nor null"
    return doc_id, text


def open_text(path: str):
    """A text stream over a (possibly compressed, possibly remote) jsonl file, universal newlines as dolma's."""
    return fsspec.open(path, "rt", compression="infer", encoding="utf-8")


def read_documents(path: str, stats: ReadStats, keep: Callable[[int], bool] | None = None) -> Iterator[Document]:
    """The documents dolma 1.1 takes from one file, in file order; with `keep`, only lines it keeps (by number)."""
    loc = 0
    try:
        with open_text(path) as handle:
            for loc, line in enumerate(handle, 1):
                stats.lines += 1
                stats.chars += len(line)
                if keep is not None and not keep(loc):
                    stats.sampled_out_lines += 1
                    stats.sampled_out_chars += len(line)
                    continue
                parsed = parse_row(line)
                if isinstance(parsed, str):
                    stats.skip(f"{path}:{loc}", parsed)
                    continue
                doc_id, text = parsed
                text = text.strip()
                if not text:
                    stats.empty += 1
                    continue
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate: the tokenizer raises and dolma skips the row
                    stats.skip(f"{path}:{loc}", "text holds a lone surrogate")
                    continue
                yield Document(doc_id, path, loc, text)
    except UnicodeDecodeError as err:
        raise RecipeError(
            f"{path}: not UTF-8 after line {loc} ({err.reason}); re-encode it (dolma would drop the rest of the file)"
        ) from None


def check_first_rows(paths: list[str]) -> None:
    """Before any work: the first non-blank line of every file is a row dolma takes (a source that was never
    converted to dolma's `{"id", "text"}` rows would otherwise be skipped row by row into nothing)."""
    for path in paths:
        try:
            with open_text(path) as handle:
                for loc, line in enumerate(handle, 1):
                    if line.strip():
                        parsed = parse_row(line)
                        if isinstance(parsed, str):
                            raise RecipeError(
                                f"{path}:{loc}: {parsed}: dolma takes JSON lines with a string 'id' and a string "
                                f"'text' and skips every other row; convert the source (a chat set needs a "
                                f"converter)"
                            )
                        break
        except UnicodeDecodeError as err:
            raise RecipeError(f"{path}: not UTF-8 ({err.reason}); re-encode it") from None
        except OSError as err:
            raise RecipeError(f"{path}: cannot be read ({err})") from None


def tokenize_documents(tokenizer, docs: list[Document], eos_id: int) -> list[Tokenized]:
    """dolma's `encode(text, add_special_tokens=True)` with only an EOS id set: the ids, then EOS unless the last
    id already is EOS (an empty encoding stays empty). One Rust batch call for the whole batch."""
    encodings = tokenizer.encode_batch_fast([d.text for d in docs], add_special_tokens=False)
    out = []
    for doc, encoding in zip(docs, encodings):
        ids = encoding.ids
        if ids and ids[-1] != eos_id:
            ids.append(eos_id)
        out.append(Tokenized(doc.id, doc.src, doc.loc, ids))
    return out


class _HashedWrites:
    """A binary file whose bytes are hashed on their way out (the gzip stream under a `.csv.gz`)."""

    def __init__(self, raw, hasher: FileHasher):
        self._raw, self._hasher = raw, hasher

    def write(self, data) -> int:
        self._hasher.update(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


class TokenFile:
    """One `part-{g}-{k:05d}.npy` (flat little-endian ids) and its `.csv.gz` (start, end, id, src, loc rows), both
    hashed as they are written (`digests`, for the manifest)."""

    def __init__(self, stem: Path, max_tokens: int, dtype: np.dtype):
        self.npy, self.csv = stem.with_name(stem.name + ".npy"), stem.with_name(stem.name + ".csv.gz")
        self.max_tokens, self.dtype = max_tokens, dtype.newbyteorder("<")
        self.written = self.documents = 0
        self._npy_hash, self._csv_hash = FileHasher(), FileHasher()
        self._npy = open(self.npy, "wb")
        self._raw = open(self.csv, "wb")
        gz = gzip.GzipFile(filename="", mode="wb", fileobj=_HashedWrites(self._raw, self._csv_hash), mtime=0)
        self._text = io.TextIOWrapper(gz, encoding="utf-8", newline="")
        self._rows = csv.writer(self._text)  # "\r\n" line ends, as dolma's csv.writer

    def write_many(self, outputs: list[Tokenized]) -> list[Tokenized]:
        """Append documents in order until one does not fit (dolma: `len + written >= max_tokens`); return the
        rest, that one first."""
        for i, out in enumerate(outputs):
            n = len(out.tokens)
            if n + self.written >= self.max_tokens:
                return outputs[i:]
            data = np.asarray(out.tokens, dtype=self.dtype).tobytes()
            self._npy_hash.update(data)
            self._npy.write(data)
            self._rows.writerow((self.written, self.written + n, out.id, out.src, out.loc))
            self.written += n
            self.documents += 1
        return []

    def close(self) -> dict:
        self._npy.close()
        self._text.close()  # flushes and ends the gzip stream (not the file under it)
        self._raw.close()
        return {"file": self.npy.name, "tokens": self.written, "documents": self.documents}

    def digests(self) -> dict[str, str]:
        """`{file name: xxh3-128}` of both files (after `close`)."""
        return {self.npy.name: self._npy_hash.digest(), self.csv.name: self._csv_hash.digest()}


def write_group(
    group: int,
    paths: list[str],
    stem: Path,
    tokenizer,
    eos_id: int,
    dtype: np.dtype,
    settings: DolmaTokensArguments,
    progress: Callable[[int], None] | None = None,
    sample=None,
) -> dict:
    """Write one group's token files (`{stem}-00000.npy`, ...) as dolma 1.1's `process_single` does; return what was
    written: files with token and document counts and checksums, the rows skipped, the lines a `sample`
    (`sampling.DocumentSample`) left out."""
    rng = random.Random(f"{settings.seed}-{group}")
    stats = ReadStats()
    pending = list(paths)

    def reader(path: str) -> Iterator[Document]:
        return read_documents(path, stats, sample.selector(path) if sample is not None else None)

    ring = [reader(pending.pop()) for _ in range(min(settings.ring_size, len(pending)))]
    files, digests, index = [], {}, 0
    current = TokenFile(Path(f"{stem}-{index:05d}"), settings.max_size, dtype)
    while pending or ring:
        batch: list[Document] = []
        for i in range(settings.batch_size):
            if not ring:  # reachable only with ring_size 1 (dolma 1.1 then fails; 1.2 refills the ring like this)
                if not pending:
                    break
                ring.append(reader(pending.pop()))
            j = i % len(ring)
            try:
                batch.append(next(ring[j]))
            except StopIteration:  # that file is done; the slot i is spent, as in dolma
                ring.pop(j)
                if not ring:
                    break
                if pending:
                    ring.append(reader(pending.pop()))
        outputs = tokenize_documents(tokenizer, batch, eos_id)
        rng.shuffle(outputs)
        remaining = current.write_many(outputs)
        if remaining:
            files.append(current.close())
            digests.update(current.digests())
            index += 1
            current = TokenFile(Path(f"{stem}-{index:05d}"), settings.max_size, dtype)
            left = current.write_many(remaining)
            if left:
                current.close()
                raise RecipeError(
                    f"{left[0].src}:{left[0].loc}: a batch of documents does not fit in one token file of max_size "
                    f"{settings.max_size} (document of {len(left[0].tokens)} tokens; dolma 1.1 would drop it and "
                    f"the rest of the batch): raise max_size or lower batch_size"
                )
        if progress is not None:
            progress(len(batch))
    files.append(current.close())
    digests.update(current.digests())
    if not any(f["documents"] for f in files):
        kept = f" ({stats.sampled_out_lines} of {stats.lines} lines left out by the source's sample)" if sample else ""
        raise RecipeError(
            f"no document with text in {paths}{kept}: dolma would leave {stem}-00000.npy as {settings.max_size} "
            f"zero tokens; remove these files from the source" + (" or raise sample.fraction" if sample else "")
        )
    return {
        "files": files, "digests": digests, "empty_rows": stats.empty, "invalid_rows": stats.invalid,
        "examples": stats.examples, "lines": stats.lines, "chars": stats.chars,
        "sampled_out_lines": stats.sampled_out_lines, "sampled_out_chars": stats.sampled_out_chars,
    }  # fmt: skip
