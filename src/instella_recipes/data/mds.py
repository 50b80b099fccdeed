"""MDS shards through mosaicml-streaming: the layout of the authors' released Instella-Long data (`amd/Instella-Long`).

The authors read folders of MDS shards with streaming's `StreamingDataset`, one `Stream(local=folder,
proportion=p)` per `folder@p` entry of their config (instella-long `instella/data/__init__.py` L51-83), shuffled with
their seed, `epoch_size = global batch x steps / SP size` rows and `replication = SP size` (the ranks of an SP group
read the same rows). A row holds `input_ids` and optionally `indices` (the (start, end) document spans; without them
the row is one document) and `label_mask` (`instella/data/streaming_dataset.py` L53-101). Their collator takes the
spans up to `max_sequence_length` tokens (`MDSCollator`); the loss reads every token (targets cross document borders;
`label_mask` drops targets). Documents restart their positions here (`position_ids`), which is how transformers'
attention keeps them apart (the authors' `doc_lens` to flash-attention varlen). Their pretraining and their long SFT
read the same way; so do ours (`MDSRows`: pretraining hands the Trainer streaming's dataset, SFT hands TRL's
SFTTrainer the collated rows as a `datasets.IterableDataset`).

Our writer (`write_mds`) makes the same layout from text with streaming's `MDSWriter`, so tests and the demo read
what the authors' loader reads; documents given with a per-token mask (`pack_rows`) get the `label_mask` column. MDS
records no tokenizer; our folders get one beside the shards (`TOKENIZER_RECORD`), and a run whose tokenizer differs
stops before any work. The authors' folders carry none, which is said once in the log.

Why the import guard (`import_streaming`): mosaicml-streaming (0.13.0, every release) declares numpy<2.2, so the
Makefile installs it without its declared dependencies (its local-MDS imports are the extra `mds`). Its package
`__init__` imports its vision datasets, which need a torchvision built for the installed torch; the CPU torch here
has none that loads, so where torchvision is absent the module `streaming.vision` is registered empty before the
import. Nothing here uses it; every MDS read and write is streaming's own code.
"""

import contextlib
import importlib.util
import itertools
import json
import sys
import types
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import datasets
import numpy as np
import torch

from instella_recipes.core import RecipeError, file_digest, get_logger

from . import mds_checks

logger = get_logger(__name__)

# The columns the authors' collator reads (streaming_dataset.py L53-101), as uint32 arrays (ProLong's README shows
# its MDS input_ids as uint32); the encodings of the released shards themselves were not read (no Hub here).
COLUMNS = {"input_ids": "ndarray:uint32", "indices": "ndarray:uint32"}
LABEL_MASK_COLUMN = {"label_mask": "ndarray:uint8"}
# Ours, beside streaming's index.json (MDS has no field for it): the tokenizer the ids come from.
TOKENIZER_RECORD = "instella_tokenizer.json"
INSTALL_HINT = (
    "install it as the Makefile does: pip install -c constraints.txt -e '.[mds]' && "
    "pip install --no-deps -c constraints.txt mosaicml-streaming (its releases declare numpy<2.2; "
    "docs/instella_long.md 'Data')"
)


def import_streaming():
    """The `streaming` package, or a RecipeError naming how to install it (see the module docstring for the guard)."""
    if importlib.util.find_spec("streaming") is None:
        raise RecipeError(f"MDS data needs mosaicml-streaming, which is not installed: {INSTALL_HINT}")
    if importlib.util.find_spec("torchvision") is None and "streaming" not in sys.modules:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    try:
        import streaming
    except ImportError as err:
        raise RecipeError(f"mosaicml-streaming cannot be imported ({err}): {INSTALL_HINT}") from None
    return streaming


def parse_streams(entries: list[str], root: str | Path | None = None) -> list[tuple[Path, float | None]]:
    """`folder@proportion` entries (the authors' `data.paths`) as (folder, proportion); a bare folder has None.
    Relative folders are joined to `root` when given."""
    out = []
    for entry in entries:
        folder, sep, weight = str(entry).partition("@")
        proportion = None
        if sep:
            try:
                proportion = float(weight)
            except ValueError:
                raise RecipeError(f"mds_streams entry {entry!r}: the proportion after '@' is not a number") from None
            if proportion <= 0:
                raise RecipeError(f"mds_streams entry {entry!r}: the proportion must be > 0")
        path = Path(folder)
        out.append((Path(root) / path if root and not path.is_absolute() else path, proportion))
    if not out:
        raise RecipeError("mds_streams is empty: name at least one MDS folder (folder@proportion)")
    if len({p is None for _, p in out}) > 1:
        raise RecipeError("mds_streams: give every folder a proportion (folder@p) or none of them")
    return out


def tokenizer_digest(tokenizer_path: str | Path) -> str | None:
    """sha256 of the tokenizer.json a run uses (a file, or a folder holding one); None when there is none."""
    path = Path(tokenizer_path)
    json_path = path if path.is_file() else path / "tokenizer.json"
    return file_digest(json_path) if json_path.is_file() else None


def check_mds_folder(folder: Path, digest: str | None) -> dict:
    """One MDS folder, checked before any work: it exists, its `index.json` is streaming's MDS index with an
    `input_ids` column, and the tokenizer it records (ours) is the run's. Returns the index."""
    index_path = folder / "index.json"
    if not folder.is_dir():
        raise RecipeError(f"mds_streams: {folder} is not a folder; download amd/Instella-Long or write one with "
                          f"write_mds (docs/instella_long.md 'Data')")  # fmt: skip
    if not index_path.is_file():
        raise RecipeError(f"mds_streams: {folder} has no index.json, so it is not an MDS folder (or its download is "
                          f"incomplete): fetch it again")  # fmt: skip
    try:
        index = json.loads(index_path.read_text())
        shards = index["shards"]
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
        raise RecipeError(f"mds_streams: {index_path} is not a streaming index ({err}): {mds_checks.REDO}") from None
    if not isinstance(shards, list) or not shards or not all(isinstance(shard, dict) for shard in shards):
        raise RecipeError(f"mds_streams: {index_path} lists no shards (its 'shards' is {str(shards)[:60]}): "
                          f"{mds_checks.REDO}")  # fmt: skip
    for shard in shards:
        if shard.get("format") != "mds" or "input_ids" not in shard.get("column_names", []):
            raise RecipeError(
                f"mds_streams: {index_path} lists a {shard.get('format')} shard with columns "
                f"{shard.get('column_names')}; expected MDS rows with input_ids (the authors' layout)"
            )
    record = folder / TOKENIZER_RECORD
    if record.is_file():
        try:
            recorded = json.loads(record.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise RecipeError(f"mds_streams: {record} is not readable ({err}): {mds_checks.REDO}") from None
        written = recorded.get("tokenizer_sha256")
        rows = sum(shard.get("samples") or 0 for shard in shards if isinstance(shard.get("samples"), int))
        if isinstance(recorded.get("rows"), int) and rows != recorded["rows"]:  # a shard dropped from the index
            raise RecipeError(f"mds_streams: {index_path} lists {rows} rows, the folder was written with "
                              f"{recorded['rows']} ({TOKENIZER_RECORD}): {mds_checks.REDO}")  # fmt: skip
        if digest is not None and written != digest:
            raise RecipeError(
                f"mds_streams: {folder} was tokenised with another tokenizer (sha256 {str(written)[:12]}... in "
                f"{TOKENIZER_RECORD}, the run's is {digest[:12]}...): set tokenizer (SFT: tokenizer_name_or_path) to "
                f"the one it was written with"
            )
    else:
        logger.info(f"{folder}: no {TOKENIZER_RECORD} (the authors' MDS layout records no tokenizer); not checked")
    return index


def check_mds_streams(entries: list[str], root: str | Path | None, digest: str | None, vocab_size=None) -> list:
    """Every folder of `entries` checked (`check_mds_data`); returns the parsed (folder, proportion) list."""
    return check_mds_data(entries, root, digest, vocab_size)[0]


def check_mds_data(entries: list[str], root: str | Path | None, digest: str | None,
                   vocab_size: int | Callable[[], int] | None = None,
                   full_reads: bool = True) -> tuple[list, list]:  # fmt: skip
    """Every folder of `entries` checked before any work: its index and tokenizer record (`check_mds_folder`, all
    folders first), then its shards against the index, their checksums, token ids (below `vocab_size`, or what the
    callable returns: the tokenizer is loaded only once the folders are known to be its) and document spans
    (`mds_checks.check_shards`, full reads within the start-up budget; with `full_reads` False none: the other
    processes of a node, whose first process reads them). Returns the parsed (folder, proportion) list and the
    shards' identities for the data fingerprint."""
    streams = parse_streams(entries, root)
    indexes = [check_mds_folder(folder, digest) for folder, _ in streams]
    vocab = vocab_size() if callable(vocab_size) else vocab_size
    budget, files = mds_checks.Budget(None if full_reads else 0), []
    for (folder, _), index in zip(streams, indexes):
        files += mds_checks.check_shards(folder, index, vocab, budget)
    if full_reads:
        budget.warn()
    return streams, files


def pack_rows(documents: Iterable, seq_len: int) -> Iterator[dict]:
    """Token documents packed into rows of exactly `seq_len` tokens with their (start, end) spans, a document cut at
    a row border continuing in the next row (as prepare_data's windows); the last partial row is dropped. No span is
    shorter than 2 tokens (the authors' collator leaves those out, which would shorten the row): a 1-token document,
    or the 1-token rest of one at a row border, is not written. A document given as `(ids, mask)` (SFT-style rows)
    carries its per-token mask into the row's `label_mask`."""
    ids: list[int] = []
    masks: list[int] = []
    spans: list[tuple[int, int]] = []
    for doc in documents:
        doc, mask = (list(doc[0]), list(doc[1])) if isinstance(doc, tuple) else (list(doc), None)
        while len(doc) > 1:  # a 1-token document, or rest, is left out
            take = min(len(doc), seq_len - len(ids))
            if seq_len - len(ids) - take == 1:  # it would leave 1 token of room: its last token goes instead
                if take == 2:
                    break
                take -= 1
                doc = doc[:take]
            spans.append((len(ids), len(ids) + take))
            ids.extend(doc[:take])
            doc = doc[take:]
            if mask is not None:
                masks.extend(mask[:take])
                mask = mask[take:]
            if len(ids) == seq_len:
                row = {"input_ids": np.asarray(ids, np.uint32), "indices": np.asarray(spans, np.uint32)}
                if mask is not None:
                    row["label_mask"] = np.asarray(masks, np.uint8)
                yield row
                ids, spans, masks = [], [], []


def write_mds(out: str | Path, rows: Iterable[dict], tokenizer_path: str | Path) -> int:
    """Write rows (`input_ids`, `indices`, optionally `label_mask`) as an MDS folder with streaming's `MDSWriter`,
    then the tokenizer record; returns the number of rows. The record is written last, so a folder without it was
    not finished by us."""
    streaming = import_streaming()
    out = Path(out)
    if (out / "index.json").exists():
        raise RecipeError(f"{out} already holds an MDS index; choose a new folder")
    rows = iter(rows)
    first = next(rows, None)
    if first is None:
        raise RecipeError(f"no rows to write to {out}: the text is shorter than one row")
    columns = {**COLUMNS, **(LABEL_MASK_COLUMN if "label_mask" in first else {})}
    count = 0
    # xxh3_128 of each shard in index.json: readers check it (`mds_checks`); it costs a pass at memory speed
    with streaming.MDSWriter(out=str(out), columns=columns, compression=None, hashes=["xxh3_128"]) as writer:
        for row in itertools.chain([first], rows):
            writer.write({key: np.asarray(row[key], dtype=columns[key].split(":")[1]) for key in columns})
            count += 1
    record = {"tokenizer_sha256": tokenizer_digest(tokenizer_path), "rows": count, "columns": columns}
    (out / TOKENIZER_RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return count


def streaming_dataset(streams: list, seed: int, batch_size: int, epoch_size: int, replication: int,
                      num_canonical_nodes: int | None = None):  # fmt: skip
    """streaming's `StreamingDataset` over the folders, as the authors build theirs (`build_streaming_dataset`):
    local streams with their proportions, shuffled with the run's seed, `epoch_size` rows, every SP group's ranks
    reading the same rows (`replication`). The shuffle also depends on `num_canonical_nodes`; None (the authors')
    is streaming's default, the nodes of the launch over the replication."""
    streaming = import_streaming()
    from .mds_dataset import CheckedStreamingDataset  # imports streaming at module level: only once it is known here

    return CheckedStreamingDataset(
        streams=[streaming.Stream(local=str(folder), proportion=p) for folder, p in streams],
        shuffle=True,
        shuffle_seed=seed,
        batch_size=batch_size,
        epoch_size=epoch_size,
        replication=replication if replication > 1 else None,
        num_canonical_nodes=num_canonical_nodes,
    )


class MDSCollator:
    """Rows from the authors' MDS layout as the Trainer's batch, as their `StreamingDataCollator` cuts them
    (streaming_dataset.py L53-101): the spans of `indices` (the whole row without them) are taken in order, each cut
    at what is left of `seq_len` (their `per_device_max_tokens`), a span of fewer than 2 tokens left out; `labels` =
    the kept input_ids with `label_mask`-dropped targets at -100; with document masking `position_ids` restart at
    each kept span (transformers' per-document attention, their `doc_lens`)."""

    def __init__(self, seq_len: int, document_masking: bool, vocab_size: int | None = None):
        self.seq_len = seq_len
        self.document_masking = document_masking
        self.vocab_size = vocab_size  # set: a row with a larger id stops the run with one line (past the budget)

    def _spans(self, item: dict, n: int) -> list[tuple[int, int]]:
        spans = item.get("indices")
        problem = mds_checks.span_problem(spans, n) if spans is not None else None
        if problem:  # a row past the start-up budget's full read (mds_checks): the same line, mid-run
            raise mds_checks.MDSDataError(
                f"mds_streams: a row of the MDS folders: {problem}: write the folder again with (start, end) spans "
                f"sorted, not overlapping, inside the row"
            )
        spans = [(0, n)] if spans is None or len(spans) == 0 else np.asarray(spans).reshape(-1, 2).tolist()
        kept, left = [], self.seq_len
        for start, end in spans:
            end = start + min(end - start, left)
            if end - start > 1:
                kept.append((int(start), int(end)))
                left -= end - start
            elif left <= 0:
                break
        return kept

    def row(self, item: dict) -> dict:
        all_ids = np.asarray(item["input_ids"], dtype=np.int64)
        if self.vocab_size is not None and all_ids.size and int(all_ids.max()) >= self.vocab_size:
            raise mds_checks.MDSDataError(
                f"mds_streams: a row of the MDS folders holds token id {int(all_ids.max())}, beyond the tokenizer's "
                f"{self.vocab_size} ids: set tokenizer to the one the folders were written with"
            )
        spans = self._spans(item, len(all_ids))
        ids = torch.from_numpy(np.concatenate([all_ids[a:b] for a, b in spans]))
        labels = ids.clone()
        if item.get("label_mask") is not None:
            mask = np.asarray(item["label_mask"], dtype=bool)
            labels[~torch.from_numpy(np.concatenate([mask[a:b] for a, b in spans]))] = -100
        out = {"input_ids": ids, "labels": labels}
        if self.document_masking:
            out["position_ids"] = torch.cat([torch.arange(b - a) for a, b in spans])
        return out

    def __call__(self, items: list[dict]) -> dict:
        return stack_rows([self.row(item) for item in items])


def stack_rows(rows: list[dict]) -> dict:
    """Collated rows (tensors, or the lists a `datasets` row holds) as one batch of int64 tensors; rows of one
    length only (the authors' micro-batch is 1)."""
    if len({len(r["input_ids"]) for r in rows}) > 1:
        raise RecipeError(
            "MDS rows of different lengths in one micro-batch: set per_device_train_batch_size 1 (the authors')"
        )
    return {key: torch.stack([torch.as_tensor(np.asarray(r[key]), dtype=torch.long) for r in rows]) for key in rows[0]}


class MDSRows:
    """What a training stage reads from MDS folders: streaming's dataset (built on first use, after every check), its
    collator, the row length (`seq_len`) and the rows of one epoch (`len`). Pretraining hands the Trainer `dataset`
    and `collator`; SFT hands TRL `iterable_dataset()` (the collated rows) and `stack_rows`."""

    def __init__(self, streams: list, seq_len: int, document_masking: bool, seed: int, batch_size: int,
                 epoch_size: int, replication: int, num_canonical_nodes: int | None = None):  # fmt: skip
        self.streams, self.seq_len, self.seed = streams, seq_len, seed
        self.batch_size, self.epoch_size, self.replication = batch_size, epoch_size, replication
        self.num_canonical_nodes = num_canonical_nodes
        self.collator = MDSCollator(seq_len, document_masking)
        self.preview = False
        self._dataset = None

    def __len__(self) -> int:
        return self.epoch_size

    @property
    def dataset(self):
        if self._dataset is None:
            self._dataset = streaming_dataset(
                self.streams, self.seed, self.batch_size, self.epoch_size, self.replication, self.num_canonical_nodes
            )
        return self._dataset

    def iterable_dataset(self) -> datasets.IterableDataset:
        """The collator's rows (`input_ids`, `labels`, `position_ids`: one document each span) in streaming's epoch
        order, as the `datasets.IterableDataset` TRL's SFTTrainer takes (it refuses a torch dataset); its rows are
        already tokenised, packed and labelled, so TRL's preparation is skipped (`skip_prepare_dataset`)."""
        keys = ROW_KEYS if self.collator.document_masking else ROW_KEYS[:2]
        features = datasets.Features({key: datasets.Sequence(datasets.Value("int64")) for key in keys})
        return datasets.IterableDataset.from_generator(_collated_rows, features=features, gen_kwargs={"rows": self})

    @contextlib.contextmanager
    def previewing(self):
        """While inside: a pass over `iterable_dataset()` reads the first row by streaming's random access only.
        TRL's SFTTrainer reads one row when it is built; an iteration of streaming's dataset would start its epoch
        0 (and count it), so training would then read epoch 1, another order than the authors'."""
        self.preview = True
        try:
            yield self
        finally:
            self.preview = False


ROW_KEYS = ("input_ids", "labels", "position_ids")


def _collated_rows(rows: MDSRows) -> Iterator[dict]:
    """The generator behind `MDSRows.iterable_dataset` (module level: `datasets` names the generator it runs)."""
    items = [rows.dataset[0]] if rows.preview else rows.dataset
    for item in items:
        yield {key: value.numpy() for key, value in rows.collator.row(item).items()}
