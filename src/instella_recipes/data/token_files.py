"""OLMo token files, read as the authors' trainer reads them: the same instances, in the same order, on every rank.

A token file is what `dolma tokens` writes and what Instella's configs list one by one in `data.paths`: a flat array
of little-endian uint16 token ids, EOS (0) after every document, no BOS and no header (despite the `.npy` name).
The authors' loader (`instella/data/memmap_dataset.py`, `iterable_dataset.py`, `__init__.py`) does, and so do we:

1. instances: each file in path order is cut into `seq_len`-token instances, its remainder dropped; instance i is the
   i-th over all files (`TokenFiles`);
2. order: `np.arange(N, dtype=uint32)` shuffled by `np.random.Generator(np.random.PCG64(seed + epoch))`, with seed
   = `data.seed` or `seed` (here `data_seed` or `seed`) and epoch 0 in a one-epoch run (`olmo_permutation`);
3. cut to whole global batches (`drop_last: true`: the rank-divisible `total_size`, then each rank's last partial
   device batch);
4. rank r takes positions r, r + world, r + 2 world, ... of that order; its device batches (global / world) are
   consecutive runs of them, and the trainer splits each into micro-batches in order;
5. a resume starts at `start_index = step x global batch` of the same order.

`OLMoOrderSampler` yields that order for the transformers Trainer, interleaved so that accelerate's own sharding of
the Trainer's dataloader hands each rank exactly its slice (see the class). Files are memory-mapped; nothing reads a
whole file.
"""

import bisect
import itertools
import os
from pathlib import Path

import numpy as np
import torch

from instella_recipes.core import MANIFEST, RecipeError, read_manifest
from instella_recipes.core.manifest import HASH
from instella_recipes.data.integrity import Checked, sample_digest, verify_contents, warn_unverified
from instella_recipes.data.packing import position_ids_for

TOKEN_DTYPE = np.dtype("<u2")  # dolma tokens' and MemMapDataset's default (uint16)
NPY_MAGIC = b"\x93NUMPY"
# The start-up token-id check reads this many tokens at a file's head, middle and tail (see `check_token_ids`).
SAMPLE_TOKENS = 32768


def read_path_list(
    data_paths: list[str] | str, data_root: str | None = None, verify: bool = True
) -> tuple[list[str], list[Path]]:
    """The token files a recipe names: `(entries as listed, resolved paths)`.

    `data_paths` is a list of paths, or a single `.txt` file with one path a line (blank lines and `#` comments
    skipped). Relative entries are joined to `data_root` (default: the current directory), so a list can name the
    authors' paths verbatim and `data_root` says where the local copy lives. Every file must exist, and have the
    size the manifest beside it records, where there is one (`check_against_manifests`), and its checksum as far as
    `integrity.verify_contents` checks at start-up (`verify=False`: sizes only, for a caller that hashes them all)."""
    items = [data_paths] if isinstance(data_paths, str | Path) else list(data_paths or [])
    if not items:
        raise RecipeError("data_paths is empty: list token files, or name a .txt file with one path a line")
    sources: list[tuple[str, str]] = []  # (entry, where it was listed)
    if len(items) == 1 and str(items[0]).endswith(".txt"):
        list_file = Path(items[0])
        if not list_file.is_file():
            raise RecipeError(f"data_paths: list file {list_file} does not exist")
        for number, line in enumerate(list_file.read_text().splitlines(), start=1):
            entry = line.strip()
            if entry and not entry.startswith("#"):
                sources.append((entry, f"{list_file}:{number}"))
        if not sources:
            raise RecipeError(f"data_paths: list file {list_file} names no token file")
        verify_contents(check_against_manifests([(list_file, f"data_paths: list file {list_file}")]))
    else:
        sources = [(str(item), f"data_paths[{i}]") for i, item in enumerate(items)]
    root = Path(data_root) if data_root else Path(".")
    paths = [Path(entry) if Path(entry).is_absolute() else root / entry for entry, _ in sources]
    for (_, where), path in zip(sources, paths):
        _check_is_token_path(path, f"{where}: token file")
    missing = [i for i, path in enumerate(paths) if not path.is_file()]
    if missing:
        entry, where = sources[missing[0]]
        more = f" ({len(missing) - 1} more of the {len(paths)} listed are missing too)" if len(missing) > 1 else ""
        raise RecipeError(
            f"{where}: token file {paths[missing[0]]} does not exist{more}; set data_root to the folder that holds "
            f"'{entry}' (now {str(root)!r})"
        )
    described = check_against_manifests(
        [(path, f"{where}: token file {path}") for path, (_, where) in zip(paths, sources)]
    )
    if not verify:
        return [entry for entry, _ in sources], paths
    root_flag = f" --data_root {data_root}" if data_root else ""
    listed = " ".join(str(i) for i in items)
    warn_unverified(verify_contents(described), f"python scripts/verify_data.py --data_paths {listed}{root_flag}")
    return [entry for entry, _ in sources], paths


def _check_is_token_path(path: Path, name: str) -> None:
    """A listed path that is a folder, or a symbolic link that leads nowhere (a loop, a dangling link), is named as
    what it is, not as missing."""
    if path.is_dir():
        raise RecipeError(f"{name} {path} is a folder, not a token file: list the files in it (one path a line)")
    if path.is_symlink():
        try:
            path.resolve(strict=True)
        except RuntimeError:
            raise RecipeError(f"{name} {path} is a symbolic link that loops (it leads back to itself)") from None
        except OSError:
            raise RecipeError(
                f"{name} {path} is a symbolic link to {os.readlink(path)}, which does not exist"
            ) from None


def check_against_manifests(files: list[tuple[Path, str]]) -> list[Checked]:
    """Each `(path, how to name it)` whose folder holds a stage manifest (`prepare_data --layout olmo` writes one
    beside its token files, and one beside its list) is a file that manifest describes, with the size it records;
    otherwise a `RecipeError` naming the file. Sizes only here (one `stat` a file); returns the files with the
    checksums their manifests record, for `integrity.verify_contents` (which scales to terabytes)."""
    out = []
    described: dict[Path, tuple[str, dict] | None] = {}  # folder -> (stage, {name: {"size", ...}}) of its manifest
    for path, name in files:
        folder = path.parent
        if folder not in described:
            manifest = read_manifest(folder) or {}
            integrity = manifest.get("integrity")
            listed = integrity.get("files") if isinstance(integrity, dict) else None
            described[folder] = (manifest.get("stage", "?"), listed) if isinstance(listed, dict) else None
        if described[folder] is None:
            continue
        stage, listed = described[folder]
        entry = listed.get(path.name)
        redo = f"run the '{stage}' stage that wrote {folder} again"
        if entry is None:
            raise RecipeError(
                f"{name} is not one of the files the {MANIFEST} beside it describes (added after the '{stage}' stage "
                f"finished): remove it, or {redo}"
            )
        size = path.stat().st_size
        if size != entry.get("size"):
            raise RecipeError(
                f"{name} is {size} bytes, the {MANIFEST} beside it says {entry.get('size')} (it changed after it "
                f"was written): {redo}"
            )
        out.append(Checked(path, name, entry.get(HASH), redo))
    return out


def check_token_file(path: Path) -> int:
    """The file's size in tokens; a `RecipeError` when it cannot be a flat uint16 token file."""
    size = path.stat().st_size
    if size % TOKEN_DTYPE.itemsize:
        raise RecipeError(
            f"token file {path}: {size} bytes is not a whole number of uint16 tokens (odd size): a truncated copy, or "
            f"not a token file; re-copy or re-tokenise it"
        )
    with open(path, "rb") as handle:
        if handle.read(len(NPY_MAGIC)) == NPY_MAGIC:
            raise RecipeError(
                f"token file {path}: a NumPy .npy file with a header; token files are flat uint16 arrays as "
                f"`dolma tokens` writes them (np.save adds a header): write them with ndarray.tofile"
            )
    return size // TOKEN_DTYPE.itemsize


def check_token_ids(path: Path, num_tokens: int, limit: int) -> None:
    """Every sampled id is below `limit` (the tokenizer's size).

    Sampled, not complete: the head, middle and tail `SAMPLE_TOKENS` of each file (all of a small file), a vectorised
    max over the memory map. A full pass over stage 1's ~4T tokens (8 TB) would take hours before the first step,
    and a cache beside the data would need write access to it. `TokenFiles.__getitem__` completes the check as
    training reads: each instance's max is checked (4096 values, microseconds), so a bad id stops the run with its
    file and offset instead of an out-of-range embedding lookup (on GPUs a device-side assert)."""
    if num_tokens == 0:
        return
    tokens = np.memmap(path, dtype=TOKEN_DTYPE, mode="r", shape=(num_tokens,))
    starts = sorted({0, max(0, num_tokens // 2 - SAMPLE_TOKENS // 2), max(0, num_tokens - SAMPLE_TOKENS)})
    for start in starts:
        block = tokens[start : start + SAMPLE_TOKENS]
        if int(block.max()) >= limit:
            offset = start + int(np.argmax(block >= limit))
            raise RecipeError(
                f"token file {path}: token id {int(tokens[offset])} at token {offset} is >= the tokenizer's {limit} "
                f"ids: the file was tokenised with another tokenizer (or is not a token file)"
            )


class TokenIdError(RecipeError, ValueError):
    """An id beyond the tokenizer found as training reads a token file: a bad input, so the entry point prints one
    `error:` line. torch's DataLoader re-raises a worker's exception as `type(text with the worker's traceback)`;
    the original message (that text's last line) is kept, so the line stays one line."""

    def __init__(self, message: str):
        if "Original Traceback" in message:
            last = message.rstrip().splitlines()[-1]  # "[module.]TokenIdError: <the original message>"
            message = last.split(f"{type(self).__name__}: ", 1)[-1]
        super().__init__(message)


class TokenFiles(torch.utils.data.Dataset):
    """Instances of `seq_len` tokens over token files in path order (each file's remainder dropped), as
    `{input_ids, labels[, position_ids]}` (labels = input_ids; the model shifts them). Instance i is the authors'
    `MemMapDataset` index i.

    The DataLoader fetches a micro-batch at once through `__getitems__`: the rows are sliced from plain ndarray views
    of the memory maps (numpy's memmap subclass costs microseconds per slice and per reduction), each row's max is
    checked, and one `np.stack(..., dtype=int64)` copies and widens them in one pass, so the per-instance work stays
    below the packed-window reader's (benchmarks/bench_token_files.py)."""

    def __init__(self, paths: list[Path], seq_len: int, vocab_limit: int | None = None, eos_id: int = 0,
                 document_masking: bool = False):  # fmt: skip
        self.paths = [Path(p) for p in paths]
        self.seq_len = int(seq_len)
        self.vocab_limit = vocab_limit
        self.eos_id = eos_id
        self.document_masking = document_masking
        self.num_tokens = [check_token_file(p) for p in self.paths]
        counts = [n // self.seq_len for n in self.num_tokens]
        self.starts = list(itertools.accumulate(counts, initial=0))  # instance index where each file begins
        self._maps: dict[int, np.ndarray] = {}

    def check_ids(self) -> None:
        if self.vocab_limit is not None:
            for path, n in zip(self.paths, self.num_tokens):
                check_token_ids(path, n, self.vocab_limit)

    def __len__(self) -> int:
        return self.starts[-1]

    def __getstate__(self):  # DataLoader workers (spawn) re-open the maps; a pickled map would copy the file
        return {**self.__dict__, "_maps": {}}

    def _tokens(self, file: int) -> np.ndarray:
        tokens = self._maps.get(file)
        if tokens is None:
            mapped = np.memmap(self.paths[file], dtype=TOKEN_DTYPE, mode="r", shape=(self.num_tokens[file],))
            tokens = self._maps[file] = mapped.view(np.ndarray)  # the view keeps the map open
        return tokens

    def locate(self, index: int) -> tuple[int, int]:
        """(file number, first token offset) of instance `index`."""
        if not 0 <= index < len(self):
            raise IndexError(f"instance {index} is out of range for {len(self)} instances")
        file = bisect.bisect_right(self.starts, index) - 1
        return file, (index - self.starts[file]) * self.seq_len

    def _row(self, index: int) -> np.ndarray:
        file, offset = self.locate(index)
        return self._tokens(file)[offset : offset + self.seq_len]

    def _check_rows(self, rows: list[np.ndarray], indices: list[int]) -> None:
        if self.vocab_limit is None or max(int(row.max()) for row in rows) < self.vocab_limit:
            return
        index = next(i for i, row in zip(indices, rows) if int(row.max()) >= self.vocab_limit)
        file, offset = self.locate(index)
        raise TokenIdError(
            f"token file {self.paths[file]}: an id >= the tokenizer's {self.vocab_limit} ids in tokens "
            f"{offset}..{offset + self.seq_len} (instance {index}), found while training (the start-up check samples "
            f"each file's head, middle and tail): the file was tokenised with another tokenizer; re-tokenise it or "
            f"drop it from data_paths"
        )

    def __getitems__(self, indices: list[int]) -> list[dict]:
        indices = [int(i) for i in indices]
        rows = [self._row(i) for i in indices]
        self._check_rows(rows, indices)
        # labels share input_ids' storage: collators stack each key into its own batch tensor (a copy)
        out = [{"input_ids": ids, "labels": ids} for ids in torch.from_numpy(np.stack(rows, dtype=np.int64))]
        if self.document_masking:
            for item in out:
                item["position_ids"] = position_ids_for(item["input_ids"], self.eos_id)
        return out

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])[0]

    @staticmethod
    def collate(items: list[dict]) -> dict:
        """The batch for the Trainer: input_ids (and position_ids) stacked, labels the same tensor. transformers'
        causal-LM loss pads and shifts a copy of the labels, so sharing is safe, and with dataloader workers the
        batch crosses processes once instead of twice (`default_data_collator` would stack labels into a second
        tensor)."""
        batch = {"input_ids": torch.stack([item["input_ids"] for item in items])}
        if "position_ids" in items[0]:
            batch["position_ids"] = torch.stack([item["position_ids"] for item in items])
        batch["labels"] = batch["input_ids"]
        return batch

    def fingerprint_items(self, entries: list[str]) -> list:
        """What identifies the data of a run (for resume checks): seq_len, then each file as listed, its size in
        tokens and `integrity.sample_digest` of its bytes (a file rewritten with other tokens differs)."""
        files = zip(entries, self.num_tokens, self.paths)
        return [self.seq_len, *[[entry, n, sample_digest(path)] for entry, n, path in files]]


def describe_data_change(before: list | None, after: list | None) -> str:
    """'; data_paths: ...' naming the first token file whose listing, size or contents differ between two
    `fingerprint_items` lists (a run's checkpoints and this start), or '' when there is nothing to compare. Entries
    with a 4th item (`[path, bytes, digest, kind]`: MDS shards, `sources` files) are named by that kind."""
    if not before or not after:
        return ""
    for old, new in itertools.zip_longest(before, after):
        if old == new:
            continue
        if len(old or new) == 4:
            return _describe_file_change(old, new)
        if old is None or new is None or old[0] != new[0]:
            return f"; data_paths: the list of token files differs from the checkpoints' run at {(new or old)[0]}"
        what = f"{old[1]} tokens then, {new[1]} now" if old[1] != new[1] else "same size, other tokens"
        return f"; data_paths: token file {new[0]} has other contents than when the checkpoints were written ({what})"
    return ""


def _describe_file_change(old: list | None, new: list | None) -> str:
    """`describe_data_change` for `[path, bytes, digest, kind]` entries."""
    if old is None or new is None or old[0] != new[0]:
        entry = new or old
        return f"; {entry[3]}: the list of files differs from the checkpoints' run at {entry[0]}"
    what = f"{old[1]} bytes then, {new[1]} now" if old[1] != new[1] else "same size, other bytes"
    return f"; {new[3]} {new[0]} has other contents than when the checkpoints were written ({what})"


def olmo_permutation(num_instances: int, seed: int) -> np.ndarray:
    """`IterableDataset._build_global_indices` before truncation: uint32 indices shuffled in place by numpy's PCG64."""
    if num_instances >= np.iinfo(np.uint32).max:
        raise RecipeError(f"{num_instances} instances do not fit the authors' uint32 index (< 2**32)")
    indices = np.arange(num_instances, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed=seed)).shuffle(indices)
    return indices


class OLMoOrderSampler(torch.utils.data.Sampler[int]):
    """The authors' global order, laid out for the Trainer's dataloader as accelerate shards it.

    Why no library sampler does this: transformers' `RandomSampler` and accelerate's `SeedableRandomSampler` permute
    with torch's generator, not numpy's PCG64, and never drop to whole global batches; torch's `DistributedSampler`
    slices `r::world` like the authors but torch-shuffles, and accelerate would shard its output again. accelerate's
    `prepare` wraps the dataloader's batch sampler in `BatchSamplerShard`, which sends micro-batch b to process
    b % world (with `split_batches` it slices each batch into world parts; with `dispatch_batches` process 0 reads
    world batches and scatters them in the same order). So this sampler emits, step by step, micro-batch m of every
    rank in rank order: rank r then receives positions r::world of the authors' order, in device batches of
    `global / world` split into consecutive micro-batches, on any world size. A resume skips `step x accumulation`
    micro-batches of each rank (the Trainer's `skip_first_batches`), which is the authors' `start_index = step x
    global batch`. `set_epoch(e)` reshuffles with seed + e, as the authors' next epoch (the fork's `seed += 1`,
    ai2-olmo's `seed + epoch`).

    Memory: the permutation is 4 bytes per instance per process (stage 1's ~1e9 instances: 4 GB; numpy shuffles
    1e8 in ~8 s on one core), built at the first iteration of each epoch."""

    def __init__(self, num_instances: int, global_batch: int, micro_batch: int, world_size: int, seed: int):
        if global_batch % (micro_batch * world_size):
            raise RecipeError(
                f"global batch {global_batch} is not a multiple of per-device batch {micro_batch} x {world_size} "
                f"processes"
            )
        self.num_instances, self.global_batch = num_instances, global_batch
        self.micro_batch, self.world_size, self.seed = micro_batch, world_size, seed
        self.accumulation = global_batch // (micro_batch * world_size)
        self.steps = num_instances // global_batch  # the authors' batches_per_epoch (drop_last)
        self.epoch = 0
        self._order: tuple[int, np.ndarray] | None = None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def global_order(self) -> np.ndarray:
        """The instances of this epoch's steps in the authors' global order (length steps x global batch)."""
        if self._order is None or self._order[0] != self.epoch:
            order = olmo_permutation(self.num_instances, self.seed + self.epoch)[: self.steps * self.global_batch]
            self._order = (self.epoch, order)
        return self._order[1]

    def __len__(self) -> int:
        return self.steps * self.global_batch

    def __iter__(self):
        order = self.global_order()
        for step in range(self.steps):
            block = order[step * self.global_batch : (step + 1) * self.global_batch]
            # block[j * world + r] is rank r's j-th instance of this step; j = m * micro + i for micro-batch m
            laid_out = block.reshape(self.accumulation, self.micro_batch, self.world_size).transpose(0, 2, 1)
            yield from laid_out.reshape(-1).tolist()


def token_files_from_args(data_paths, data_root, seq_len, vocab_limit, eos_id, document_masking):
    """`read_path_list` + `TokenFiles` + the start-up id check: (entries as listed, dataset)."""
    entries, paths = read_path_list(data_paths, data_root)
    dataset = TokenFiles(paths, seq_len, vocab_limit=vocab_limit, eos_id=eos_id, document_masking=document_masking)
    dataset.check_ids()
    return entries, dataset
