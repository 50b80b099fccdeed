"""MDS streaming (a training feature, `features/__init__.py`): MDS folders in a training stage (pretraining's and SFT's
`mds_streams`, the authors' Instella-Long data read by mosaicml-streaming, `data/mds.py`): the recipe fields
(`MDSStreamsArguments`), their checks before any work (`mds_rows_for`) and the Trainer's dataloader over them
(`StreamingRowsMixin`).

Why the dataloader is ours: streaming's `StreamingDataset` splits an epoch over the ranks itself (the ranks of an SP
group alike, the authors' `replication`), so its rows must not go through accelerate's sharding of the Trainer's
dataloader, which would split them again. The Trainer takes a dataloader from `get_train_dataloader` and moves each
batch to the device itself; no library flag turns the sharding off for one dataset.
"""

import hashlib
import json
from dataclasses import dataclass, field

from torch.utils.data import DataLoader

from instella_recipes.core import RecipeError, file_digest
from instella_recipes.core.checks import check_range
from instella_recipes.data import mds
from instella_recipes.data.tokenizer import load_tokenizer

from ..settings import DATA, RUN
from .feature import Feature


@dataclass
class MDSStreamsArguments:
    """The recipe fields of a stage that can read MDS folders; a mixin of its settings class."""

    mds_streams: list[str] | None = field(
        default=None,
        metadata={
            "role": DATA,
            "help": "MDS folders as folder@proportion (the authors' Instella-Long data.paths), read with "
            "mosaicml-streaming; an epoch is max_steps x the global batch rows.",
        },
    )
    data_root: str | None = field(
        default=None,
        metadata={
            "role": DATA,
            "help": "Folder that relative mds_streams (pretraining: also data_paths) entries are joined to "
            "(default: cwd).",
        },
    )
    num_canonical_nodes: int | None = field(
        default=None,
        metadata={
            "role": RUN,
            "help": "mds_streams: streaming's num_canonical_nodes, on which the shuffle depends; unset (the "
            "authors'): the launch's nodes / SP size, as streaming derives it.",
        },
    )

    def __post_init__(self):
        check_range("num_canonical_nodes", self.num_canonical_nodes, 1, integer=True, allow_none=True)
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


def check_mds_lengths(args, seq_len: int | None, seq_len_field: str) -> None:
    """What an MDS epoch needs from the settings (no file read): the row cut and `max_steps`."""
    if seq_len is None:
        raise RecipeError(f"mds_streams needs {seq_len_field}: the tokens a row is cut at (the authors' "
                          f"max_sequence_length)")  # fmt: skip
    if args.max_steps is None or args.max_steps <= 0:
        raise RecipeError("mds_streams needs max_steps: the epoch is max_steps x the global batch rows (the authors')")


def mds_rows_for(args, tokenizer_path, seq_len: int | None, seq_len_field: str, rows_per_step: int,
                 document_masking: bool) -> tuple[mds.MDSRows, dict]:  # fmt: skip
    """The MDS folders of `args.mds_streams`, checked before any work (streaming installed, each folder present,
    MDS, written with the run's tokenizer, its shards as index.json lists them, token ids within the tokenizer's
    (loaded once the folders are known to be its) and document spans sound: `mds.check_mds_data`), read as the
    authors do: `epoch_size` = the unique rows of `max_steps` steps (their global batch x steps / SP size),
    `replication` = the SP size. Returns the rows and the data's manifest (`fingerprint` over the folders, their
    proportions, index digests and each shard's size and content digest; `files`, the shards, to name a changed one;
    `instances`)."""
    check_mds_lengths(args, seq_len, seq_len_field)
    if not tokenizer_path:
        raise RecipeError("mds_streams needs tokenizer: the tokenizer the MDS rows were written with")
    mds.import_streaming()  # not installed: named here, before any work
    vocab = _VocabSize(tokenizer_path)
    first = getattr(args, "local_process_index", 0) == 0  # one process a node reads the shards in full
    streams, files = mds.check_mds_data(
        args.mds_streams, args.data_root, mds.tokenizer_digest(tokenizer_path), vocab, full_reads=first
    )
    items = [[str(folder), p, file_digest(folder / "index.json")] for folder, p in streams] + files
    rows = mds.MDSRows(
        streams, seq_len, document_masking, args.seed, args.per_device_train_batch_size,
        rows_per_step * args.max_steps, getattr(args, "sequence_parallel_size", 1), args.num_canonical_nodes,
    )  # fmt: skip
    rows.collator.vocab_size = vocab()  # rows past the start-up budget's full read: checked as they are read
    manifest = {"fingerprint": hashlib.sha256(json.dumps(items).encode()).hexdigest(), "instances": len(rows),
                "files": files}  # fmt: skip
    return rows, manifest


class _VocabSize:
    """The ids of the run's tokenizer (its added tokens included), loaded on the first call only, for the MDS rows'
    token-id checks."""

    def __init__(self, tokenizer_path):
        self.path, self.size = tokenizer_path, None

    def __call__(self) -> int:
        if self.size is None:
            try:
                self.size = len(load_tokenizer(self.path))
            except (OSError, ValueError) as err:
                raise RecipeError(f"tokenizer {self.path}: {err}") from None
        return self.size


class StreamingRowsMixin:
    """Trainer mixin: `streaming_rows=True` when the training dataset is streaming's (or reads it, as SFT's
    `MDSRows.iterable_dataset()`): a plain DataLoader over it (module docstring); else the Trainer's own.
    On resume the Trainer skips the trained batches of this loader: a fresh process's first pass is streaming's
    epoch 0 in the same order, so the skip lands on the next row (docs/instella_long.md "Data")."""

    def __init__(self, *args, streaming_rows: bool = False, **kwargs):
        self.streaming_rows = streaming_rows
        super().__init__(*args, **kwargs)

    def get_train_dataloader(self):
        if not self.streaming_rows:
            return super().get_train_dataloader()
        args = self.args
        return DataLoader(
            self.train_dataset, batch_size=args.per_device_train_batch_size, collate_fn=self.data_collator,
            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
            drop_last=args.dataloader_drop_last,
        )  # fmt: skip


FEATURE = Feature(
    name="mds_streams",
    settings=MDSStreamsArguments,
    trainer_mixin=StreamingRowsMixin,
    trainer_kwargs=lambda stage, data, model: {"streaming_rows": bool(stage.args.mds_streams)},
)
