"""Checkpoint reshaping: a torch.distributed.checkpoint (DCP) directory written by N processes -> one laid out for M
processes, or -> one Hugging Face safetensors folder.

DCP already stores every tensor with its global shape and the offsets of each saved chunk, so any number of processes
can *read* any DCP checkpoint; what changes with the world size is the layout on disk (one `__<rank>_0.distcp` file
per writer, chunk boundaries at the writers' shard boundaries). Reshaping N -> M therefore uses DCP's own machinery
and nothing else: the M processes allocate, from the checkpoint's metadata alone, every tensor as a DTensor sharded
on dim 0 over an M-rank mesh (exactly FSDP2's `fully_shard` layout: `torch.chunk` boundaries), `dcp.load` fills
them (DCP's planner reads the overlapping parts of the N-way chunks), and `dcp.save` writes them with M writers. Model
and optimizer state (Adam moments per parameter, `step`, param_groups) are carried alike; non-tensor entries are
kept as they are. The nested structure of the state dict is restored from the metadata's planner data, so the result
loads with the same `{"model": ..., "optim": ...}` keys as the original.

The HF export reads the model entries in one process (`dcp.load(..., no_dist=True)`), checks them
against the model that `config.json` describes (names and shapes: a mismatch is a clear error before anything is
written), and writes `save_pretrained` output (safetensors + config) beside the destination, renaming it into place.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._nested_dict import unflatten_state_dict
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

from instella_recipes.core import (
    RecipeError,
    atomic_output_dir,
    exit_on_recipe_error,
    parse_recipe,
    partial_path,
    setup_logging,
    swap_in_folder,
)
from instella_recipes.weights import build_meta_model

OPTIMIZER_PREFIXES = ("optim", "optimizer")


def read_metadata(path: str | Path) -> Metadata:
    """The checkpoint's metadata; a clear error if `path` is not a DCP checkpoint directory."""
    path = Path(path)
    if not (path / ".metadata").is_file():
        hint = ""
        if path.is_dir():
            inner = sorted(p.parent.name for p in path.glob("*/.metadata"))
            hint = f" (DCP checkpoints inside it: {inner})" if inner else ""
        raise RecipeError(f"{path} is not a torch.distributed.checkpoint directory: no .metadata file{hint}")
    return FileSystemReader(str(path)).read_metadata()


def writer_count(metadata: Metadata) -> int:
    """How many processes wrote the checkpoint (distinct data files)."""
    return len({info.relative_path for info in metadata.storage_data.values()})


def _model_prefix(metadata: Metadata, model_key: str | None) -> str:
    keys = metadata.state_dict_metadata
    if model_key is None:
        model_key = "model" if any(k.startswith("model.") for k in keys) else ""
    return f"{model_key}." if model_key else ""


def model_entries(metadata: Metadata, model_key: str | None = None) -> dict[str, torch.Size]:
    """{model parameter name: global shape} of the checkpoint's model part (the keys under `model_key`)."""
    prefix = _model_prefix(metadata, model_key)
    optimizer = tuple(f"{p}." for p in OPTIMIZER_PREFIXES)
    return {
        key[len(prefix) :]: md.size
        for key, md in metadata.state_dict_metadata.items()
        if key.startswith(prefix) and not key.startswith(optimizer) and isinstance(md, TensorStorageMetadata)
    }


def load_config(config_path: str | Path):
    from transformers import AutoConfig

    import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)

    path = Path(config_path)
    if not path.exists():
        raise RecipeError(f"config {path} does not exist (give a config.json or the model folder holding it)")
    try:
        return AutoConfig.from_pretrained(str(path.parent if path.is_file() else path), trust_remote_code=True)
    except (OSError, ValueError) as err:
        raise RecipeError(f"config {path}: {err}") from None


def check_matches_model(metadata: Metadata, config, model_key: str | None = None) -> None:
    """Raise a `RecipeError` naming the differences if the checkpoint's model (and optimizer) entries do not fit the
    model `config` describes: missing or unexpected parameter names, different shapes."""
    expected = {name: tensor.shape for name, tensor in build_meta_model(config).state_dict().items()}
    found = model_entries(metadata, model_key)
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = [
        f"{k}: checkpoint {tuple(found[k])} vs model {tuple(expected[k])}"
        for k in sorted(expected.keys() & found.keys())
        if found[k] != expected[k]
    ]
    optimizer_params = set()
    for key, md in metadata.state_dict_metadata.items():
        for prefix in OPTIMIZER_PREFIXES:
            if key.startswith(f"{prefix}.state.") and isinstance(md, TensorStorageMetadata) and len(md.size) > 0:
                name = key[len(prefix) + len(".state.") :].rsplit(".", 1)[0]
                optimizer_params.add(name)
                if name in expected and md.size != expected[name]:
                    shapes.append(f"{key}: checkpoint {tuple(md.size)} vs parameter {tuple(expected[name])}")
    unknown_optimizer = sorted(optimizer_params - set(expected))
    problems = []
    for label, items in (
        ("missing in the checkpoint", missing),
        ("not in the model", unexpected),
        ("shape mismatch", shapes),
        ("optimizer state for parameters not in the model", unknown_optimizer),
    ):
        if items:
            problems.append(f"{label} ({len(items)}): {', '.join(items[:5])}{' ...' if len(items) > 5 else ''}")
    if problems:
        raise RecipeError(
            f"checkpoint does not match the {config.model_type} model of the given config: " + "; ".join(problems)
        )


def _empty_target(metadata: Metadata, group, device: torch.device) -> dict:
    """A flat state dict to load into: DTensors sharded on dim 0 over `group` (plain tensors for scalars or one
    process), placeholders for non-tensor entries."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor import empty as dtensor_empty

    world = dist.get_world_size(group) if group is not None or dist.is_initialized() else 1
    mesh = DeviceMesh.from_group(group or dist.group.WORLD, device.type) if world > 1 else None
    target = {}
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            target[key] = None  # DCP replaces it with the stored object
        elif mesh is not None and len(md.size) > 0:
            target[key] = dtensor_empty(md.size, dtype=md.properties.dtype, device_mesh=mesh, placements=[Shard(0)])
        else:
            target[key] = torch.empty(md.size, dtype=md.properties.dtype, device=device)
    return target


def reshard(
    source: str | Path,
    destination: str | Path,
    *,
    group=None,
    config=None,
    model_key: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Rewrite the DCP checkpoint `source` laid out for the processes of `group` (default: the world; one process
    when torch.distributed is not initialised). Call on every rank of the group. `config` (optional) checks the
    checkpoint against the model first. The result appears at `destination` only once complete."""
    source, destination = Path(source), Path(destination)
    metadata = read_metadata(source)
    if config is not None:
        check_matches_model(metadata, config, model_key)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    if destination.exists() and not overwrite:
        raise RecipeError(f"{destination} already exists: choose a new output directory or pass --overwrite")
    if destination.resolve() == source.resolve():
        raise RecipeError("the output directory must differ from the input checkpoint")
    partial = partial_path(destination)  # DCP writes from every rank; rank 0 renames once all have finished
    if rank == 0 and partial.exists():
        shutil.rmtree(partial)
    if distributed:
        dist.barrier(group)
    device = torch.device("cpu")
    if distributed and dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    target = _empty_target(metadata, group, device)
    # Without a process group DCP runs single-process by itself (one writer).
    kwargs = {"process_group": group} if distributed else {}
    dcp.load(target, checkpoint_id=str(source), **kwargs)
    # private: no public DCP function nests a flat state dict by `planner_data` [test_private_apis]
    nested = unflatten_state_dict(target, metadata.planner_data) if metadata.planner_data else target
    dcp.save(nested, checkpoint_id=str(partial), **kwargs)
    if distributed:
        dist.barrier(group)
    if rank == 0:
        swap_in_folder(partial, destination)  # an old output loses its manifest first, then is replaced
    if distributed:
        dist.barrier(group)
    return destination


def export_hf(
    source: str | Path,
    destination: str | Path,
    config_path: str | Path,
    *,
    model_key: str | None = None,
    dtype: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the model part of DCP checkpoint `source` as a Hugging Face folder (safetensors + config.json) that
    `AutoModelForCausalLM.from_pretrained(destination)` loads. Single process; the whole model must fit in memory."""

    source, destination = Path(source), Path(destination)
    metadata = read_metadata(source)
    config = load_config(config_path)
    check_matches_model(metadata, config, model_key)
    if destination.exists() and not overwrite:
        raise RecipeError(f"{destination} already exists: choose a new output directory or pass --overwrite")
    prefix = _model_prefix(metadata, model_key)
    stored = metadata.state_dict_metadata
    state = {
        name: torch.empty(size, dtype=stored[prefix + name].properties.dtype)
        for name, size in model_entries(metadata, model_key).items()
    }  # filled in place by DCP, read by their flat keys in the checkpoint (`<model_key>.<name>`), in this process only
    dcp.load({prefix + name: tensor for name, tensor in state.items()}, checkpoint_id=str(source), no_dist=True)
    if dtype:
        state = {k: v.to(getattr(torch, dtype)) for k, v in state.items()}
    model = build_meta_model(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    with atomic_output_dir(destination, overwrite=overwrite) as partial:
        model.save_pretrained(str(partial))
    return destination


@dataclass
class ReshapeCheckpointArguments:
    """The settings of `scripts/reshape_checkpoint.py`."""

    input: str = field(default=None, metadata={"help": "DCP checkpoint directory (the one holding .metadata)"})
    output: str = field(default=None, metadata={"help": "output directory (must not exist unless --overwrite)"})
    to: str = field(default="dcp", metadata={"help": "dcp: one file per launched process; hf: safetensors folder"})
    model_config: str = field(
        default=None, metadata={"help": "config.json (or its folder) of the model; needed for hf"}
    )
    model_key: str = field(default=None, metadata={"help": "top-level key of the model state (default: 'model')"})
    dtype: str = field(default=None, metadata={"help": "hf only: cast weights, e.g. bfloat16"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output directory"})


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> None:
    """`scripts/reshape_checkpoint.py`: N -> M writers (launched with M processes), or -> an HF folder (`--to hf`)."""
    (args,) = parse_recipe([ReshapeCheckpointArguments], argv)
    setup_logging()
    if not args.input or not args.output:
        raise RecipeError("give --input <DCP checkpoint dir> and --output <dir>")
    if args.to not in ("dcp", "hf"):
        raise RecipeError(f"--to {args.to!r}: choose dcp or hf")
    metadata = read_metadata(args.input)
    if args.to == "hf":
        if not args.model_config:
            raise RecipeError("--to hf needs --model_config (the model's config.json or its folder)")
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            raise RecipeError("--to hf runs in one process: launch without torchrun")
        path = export_hf(args.input, args.output, args.model_config, model_key=args.model_key, dtype=args.dtype,
                         overwrite=args.overwrite)  # fmt: skip
        print(f"wrote Hugging Face model to {path}")
        return
    config = load_config(args.model_config) if args.model_config else None
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")  # resharding moves tensors through CPU memory; gloo is enough
    try:
        world = dist.get_world_size() if dist.is_initialized() else 1
        path = reshard(args.input, args.output, config=config, model_key=args.model_key, overwrite=args.overwrite)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"resharded {args.input} ({writer_count(metadata)} writers) -> {path} ({world} writers)")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
