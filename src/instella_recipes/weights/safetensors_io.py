"""The one safetensors reader and writer for checkpoints that are streamed tensor by tensor (convert, merge).

Reading: `TensorSource` opens every shard of a folder (or one file) lazily with `safetensors.safe_open`; a tensor is
read only when asked for. Writing: huggingface_hub plans the shards (`split_torch_state_dict_into_shards`, fed meta
tensors, so the plan costs no memory) with the Hub's file names and index; `write_shards` then saves each shard with
safetensors as soon as all of its tensors have arrived. Whole in-memory models are saved with `save_pretrained`
instead (transformers shards through the same huggingface_hub code).

Damage is a `RecipeError` naming the file (or tensor), never a traceback: a truncated, random-bytes or otherwise
unreadable file fails at its header (`check_readable`), and a tensor holding NaN or inf fails when it is read
(`TensorSource`) or, for a whole loaded model, in `check_model_finite`.

Why not `huggingface_hub.save_torch_state_dict`: it needs the whole state dict in memory, and a 3B merge of three
inputs or a 70B conversion should stay near one shard of memory.
"""

import json
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from huggingface_hub import StateDictSplit, split_torch_state_dict_into_shards
from huggingface_hub.constants import SAFETENSORS_INDEX_FILE, SAFETENSORS_SINGLE_FILE
from safetensors import safe_open
from safetensors.torch import save_file

from instella_recipes.core import RecipeError

FILENAME_PATTERN = "model{suffix}.safetensors"  # model-00001-of-00002.safetensors, or model.safetensors


class TensorSource:
    """Lazy, name-addressed tensors of a checkpoint: a `.safetensors` file, a folder of shards (with or without an
    index), or a `torch.save` file (`.pt` / `.bin`, read with `mmap=True`)."""

    def __init__(self, path: str | Path):
        path = Path(path)
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if path.is_dir() and not files:
            files = sorted([*path.glob("*.pt"), *path.glob("*.bin")])
        if not files or not all(f.is_file() for f in files):
            raise RecipeError(f"{path}: no checkpoint (want *.safetensors shards, a .safetensors or .pt file)")
        self.path = path
        self._read: dict[str, Callable[[str], torch.Tensor]] = {}
        self._handles = []
        for file in files:
            if file.suffix == ".safetensors":
                handle = _open(file)
                self._handles.append(handle)
                self._read.update({key: handle.get_tensor for key in handle.keys()})
            else:
                state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
                state = state.get("model", state) if isinstance(state, dict) else state
                self._read.update({key: state.__getitem__ for key in state})

    def keys(self) -> list[str]:
        return list(self._read)

    def __contains__(self, key: str) -> bool:
        return key in self._read

    def __call__(self, key: str) -> torch.Tensor:
        """The tensor `key`; a non-finite value in it is a `RecipeError` naming the tensor and the checkpoint."""
        tensor = self._read[key](key)
        check_finite(key, tensor, self.path)
        return tensor

    def meta(self, key: str) -> torch.Tensor:
        """A meta tensor with the stored shape and dtype (for safetensors, read from the header only)."""
        for handle in self._handles:
            if key in handle.keys():
                sliced = handle.get_slice(key)
                return torch.empty(sliced.get_shape(), dtype=_DTYPES[sliced.get_dtype()], device="meta")
        return torch.empty_like(self(key), device="meta")


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}  # fmt: skip


def _open(file: Path):
    try:
        return safe_open(str(file), "pt")
    except Exception as error:  # noqa: BLE001 - safetensors raises several types for a damaged file
        raise RecipeError(f"{file}: not a readable safetensors file ({error}); re-copy or re-write it") from None


def check_finite(name: str, tensor: torch.Tensor, where) -> None:
    """A floating-point tensor must hold no NaN or inf (a diverged or damaged checkpoint would train, merge or
    release silently: the Trainer skips every step and the output still holds the bad tensor)."""
    if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
        bad = int((~torch.isfinite(tensor)).sum())
        raise RecipeError(
            f"{where}: tensor {name} holds {bad} non-finite value(s) (NaN/inf): use an earlier checkpoint of the run "
            f"(or re-convert/re-merge it); nothing was written"
        )


def check_model_finite(model: torch.nn.Module, where) -> None:
    """Every parameter and buffer of a loaded model is finite (see `check_finite`)."""
    for name, tensor in model.state_dict().items():
        if not tensor.is_meta:
            check_finite(name, tensor.detach(), where)


def check_readable(folder: str | Path) -> None:
    """Every safetensors file of `folder` (and every shard its index names) opens: a truncated, empty or random-bytes
    file is a `RecipeError` naming it. Reads headers only."""
    folder = Path(folder)
    files = set(folder.glob("*.safetensors"))
    if (folder / SAFETENSORS_INDEX_FILE).is_file():
        files |= set(weight_files(folder).values())
    for file in sorted(files):
        with _open(file):
            pass


def plan_shards(meta_tensors: dict[str, torch.Tensor], max_shard_size: int | str) -> StateDictSplit:
    """The Hub's shard plan (file names, index) for tensors of these shapes and dtypes."""
    return split_torch_state_dict_into_shards(
        meta_tensors, filename_pattern=FILENAME_PATTERN, max_shard_size=max_shard_size
    )


def write_shards(tensors: Iterable[tuple[str, torch.Tensor]], folder: str | Path, plan: StateDictSplit) -> int:
    """Save `tensors` (in any order) into `folder` as `plan` says; each shard is written once all of its tensors
    have arrived, so memory holds about one shard when they arrive in plan order. Returns the tensor count."""
    folder = Path(folder)
    pending: dict[str, torch.Tensor] = {}
    count = 0
    for key, tensor in tensors:
        if key not in plan.tensor_to_filename:
            raise RecipeError(f"tensor {key} is not in the shard plan (the plan and the stream disagree)")
        pending[key] = tensor.contiguous()
        count += 1
        filename = plan.tensor_to_filename[key]
        names = plan.filename_to_tensors[filename]
        if all(name in pending for name in names):
            save_file({name: pending.pop(name) for name in names}, str(folder / filename), metadata={"format": "pt"})
    if pending:
        raise RecipeError(f"{len(pending)} tensors never completed their shard (the plan and the stream disagree)")
    if plan.is_sharded:
        index = {"metadata": plan.metadata, "weight_map": plan.tensor_to_filename}
        (folder / SAFETENSORS_INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return count


def weight_files(folder: str | Path) -> dict[str, Path]:
    """tensor name -> the shard holding it, for an HF model folder (sharded with an index, or one file)."""
    folder = Path(folder)
    index = folder / SAFETENSORS_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError) as err:
            raise RecipeError(f"{index}: not a safetensors index ({err}); re-write the model folder") from None
        for name in sorted(set(weight_map.values())):
            if not (folder / name).is_file():
                raise RecipeError(f"{index} names {name}, which is missing: re-copy the model folder")
        return {k: folder / v for k, v in weight_map.items()}
    single = folder / SAFETENSORS_SINGLE_FILE
    if single.is_file():
        with _open(single) as handle:
            return {k: single for k in handle.keys()}
    raise RecipeError(f"{folder}: no {SAFETENSORS_SINGLE_FILE} or {SAFETENSORS_INDEX_FILE} (want a safetensors model)")


def index_single_file(folder: str | Path) -> None:
    """A one-file `model.safetensors` becomes `model-00001-of-00001.safetensors` plus an index, the layout of a
    sharded save, so every release looks the same. Sizes come from the file's header (no tensor is read)."""
    folder = Path(folder)
    single = folder / SAFETENSORS_SINGLE_FILE
    if (folder / SAFETENSORS_INDEX_FILE).exists() or not single.exists():
        return
    source = TensorSource(single)
    total = sum(source.meta(key).nbytes for key in source.keys())
    shard = FILENAME_PATTERN.format(suffix="-00001-of-00001")
    single.rename(folder / shard)
    index = {"metadata": {"total_size": total}, "weight_map": dict.fromkeys(sorted(source.keys()), shard)}
    (folder / SAFETENSORS_INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
