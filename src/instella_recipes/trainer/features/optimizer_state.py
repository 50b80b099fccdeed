"""Optimizer-state continuation (a training feature, `features/__init__.py`): carry AdamW's state from one stage into
the next (Instella stage 1 -> stage 2, SPEC.md 2.1; Instella-Long phase 1 -> phase 2 -> SFT).

The authors' stage 2 loads the stage-1 checkpoint with `reset_trainer_state: true` only; `reset_optimizer_state`
stays False, so the whole AdamW state (first and second moments and each parameter's step count, which sets the bias
correction) carries over, while the trainer's step counter and LR schedule start anew. Stage 1 writes its final
optimizer state with `save_optimizer_state: true` to `<output_dir>/optimizer_state/`; stage 2 reads it from
`<model_name_or_path>/optimizer_state/` with `load_optimizer_state: true`, or from `<optimizer_state_from>/
optimizer_state/` (a run other than the input model's).

The state is a torch.distributed.checkpoint (DCP) checkpoint keyed by parameter name, written through
`get_optimizer_state_dict` / `set_optimizer_state_dict`: every rank writes its own shards under FSDP2, and the
reader may run on another world size or sharding (DCP reshards on load), or on one process without FSDP.
The param-group hyperparameters (lr, betas, eps, weight decay) are the new stage's recipe, not the saved ones.
"""

from dataclasses import dataclass, field
from pathlib import Path

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

from instella_recipes.core import RecipeError

from ..settings import RUN
from .feature import Feature

OPTIMIZER_DIR = "optimizer_state"
KEY = "optimizer"


@dataclass
class OptimizerStateArguments:
    """The recipe fields of optimizer-state continuation; a mixin of the stage's settings class."""

    save_optimizer_state: bool = field(
        default=False,
        metadata={"role": RUN, "help": "Write the final AdamW state to <output_dir>/optimizer_state/ (DCP)."},
    )
    load_optimizer_state: bool = field(
        default=False,
        metadata={
            "role": RUN,
            "help": "Start from <model_name_or_path>/optimizer_state/ (moments kept, new step counter/LR).",
        },
    )
    optimizer_state_from: str | None = field(
        default=None,
        metadata={
            "role": RUN,
            "help": "Instead: start from <this run>/optimizer_state/ (Instella-Long phase 2: phase 1's moments, "
            "while the model is phase 1's reconfigured to a new RoPE; the Long SFT: phase 2's).",
        },
    )

    def __post_init__(self):
        if self.load_optimizer_state and self.optimizer_state_from:
            raise ValueError("set load_optimizer_state or optimizer_state_from (the run whose AdamW state), not both")
        if self.load_optimizer_state and hasattr(self, "model_name_or_path") and not self.model_name_or_path:
            raise ValueError(
                "load_optimizer_state: true needs model_name_or_path (the run whose optimizer_state/ to continue)"
            )
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


def torch_optimizer(optimizer):
    """The torch optimizer inside accelerate's `AcceleratedOptimizer` (DCP needs the real one)."""
    return getattr(optimizer, "optimizer", optimizer)


def save_optimizer_state(model, optimizer, folder: str | Path) -> None:
    """Every rank: write the optimizer state of `model`'s parameters to `folder` (DCP)."""
    optimizer = torch_optimizer(optimizer)
    dcp.save({KEY: get_optimizer_state_dict(model, optimizer)}, checkpoint_id=str(folder))


def check_optimizer_state(folder: str | Path, field: str = "model_name_or_path") -> Path:
    """The DCP folder, or a RecipeError saying how to make it (before any work): its `.metadata` readable and every
    data file it names present and as long as the metadata says (a truncated or partly copied folder would be a
    traceback deep in DCP's load). `field` names the setting that points at the run (`model_name_or_path` with
    `load_optimizer_state`, or `optimizer_state_from`)."""
    folder = Path(folder)
    if not (folder / ".metadata").is_file():
        drop = "load_optimizer_state: false" if field == "model_name_or_path" else f"drop {field}"
        raise RecipeError(
            f"{folder} holds no optimizer state (DCP '.metadata' missing); the run in {field} must end with "
            f"save_optimizer_state: true (the Instella stage-1 and Long phase recipes set it), or {drop} for a "
            f"fresh optimizer"
        )
    redo = f"copy it again from the run in {field}, or run that run's last stage again with save_optimizer_state: true"
    metadata = read_metadata(folder, redo)
    needed: dict[str, int] = {}
    for info in metadata.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    for name, end in sorted(needed.items()):
        path = folder / name
        if not path.is_file():
            raise RecipeError(f"{field}: optimizer state {folder}: {name} is missing: {redo}")
        if path.stat().st_size < end:
            raise RecipeError(f"{field}: optimizer state {folder}: {name} is {path.stat().st_size} bytes, its "
                              f".metadata needs {end} (truncated): {redo}")  # fmt: skip
    return folder


def read_metadata(folder: Path, redo: str):
    """DCP's metadata of the folder (its tensors' names, global shapes and where their bytes are), or a
    RecipeError naming the folder."""
    try:
        return dcp.FileSystemReader(str(folder)).read_metadata()
    except Exception as err:  # noqa: BLE001 - a damaged pickle raises anything (EOFError, UnpicklingError, ...)
        raise RecipeError(
            f"optimizer state {folder}: its .metadata cannot be read ({type(err).__name__}): {redo}"
        ) from None


def check_optimizer_shapes(model, folder: str | Path) -> None:
    """Every trainable parameter of `model` has an AdamW state of its own shape in the DCP folder, and the folder
    holds no other (a state saved from another model shape would be a traceback in DCP's load, or worse): else one
    RecipeError naming the first parameter that differs."""
    folder = Path(folder)
    redo = (
        "point optimizer_state_from (or model_name_or_path with load_optimizer_state) at a run of this model's shape, "
        "or drop it for a fresh optimizer"
    )
    saved = {}
    for key, meta in read_metadata(folder, redo).state_dict_metadata.items():
        prefix, _, rest = key.partition(".state.")
        if prefix == KEY and rest.endswith(".exp_avg"):
            saved[rest.removesuffix(".exp_avg")] = list(getattr(meta, "size", []))
    params = {name: list(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    for name, shape in params.items():
        if name not in saved:
            raise RecipeError(f"optimizer state {folder} has no state for parameter {name} (it was saved "
                              f"from another model): {redo}")  # fmt: skip
        if saved[name] != shape:
            raise RecipeError(f"optimizer state {folder}: parameter {name} is {saved[name]} there, {shape} in this "
                              f"model: {redo}")  # fmt: skip
    extra = sorted(set(saved) - set(params))
    if extra:
        raise RecipeError(f"optimizer state {folder} holds parameters this model lacks ({extra[0]}, "
                          f"{len(extra)} in all): {redo}")  # fmt: skip


def load_optimizer_state(model, optimizer, folder: str | Path) -> None:
    """Every rank: replace the (fresh) optimizer's state with the one saved in `folder`, keeping the current
    param-group hyperparameters. `get_optimizer_state_dict` first materialises the empty state (a zero-gradient
    step at lr 0 that leaves the parameters unchanged), which DCP needs as the load target."""
    optimizer = torch_optimizer(optimizer)
    hyper = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    state = {KEY: get_optimizer_state_dict(model, optimizer)}
    dcp.load(state, checkpoint_id=str(folder))
    set_optimizer_state_dict(model, optimizer, state[KEY])
    # exactly the new stage's groups: a stale `initial_lr` would become the base LR of the new LambdaLR
    for group, values in zip(optimizer.param_groups, hyper, strict=True):
        params = group["params"]
        group.clear()
        group.update(values, params=params)


class ContinueOptimizerStateMixin:
    """Trainer mixin: `optimizer_state_from=<folder>` (a checked `optimizer_state/` folder) replaces the fresh AdamW
    state with that one, keeping this run's hyperparameters, step counter and schedule (the authors' continued stages:
    `reset_trainer_state: true`, `reset_optimizer_state` unset)."""

    def __init__(self, *args, optimizer_state_from=None, **kwargs):
        self.optimizer_state_from = optimizer_state_from
        super().__init__(*args, **kwargs)
        if optimizer_state_from is not None:  # the model is built: its shapes against the state, before training
            check_optimizer_shapes(self.model, optimizer_state_from)

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        """The Trainer calls this once the optimizer is prepared (sharded) and before any update; the continued
        state is loaded here. When the run resumes from its own checkpoint, the Trainer loads that checkpoint's
        optimizer afterwards, which replaces this state."""
        if self.optimizer_state_from is not None:
            load_optimizer_state(self.model, optimizer or self.optimizer, self.optimizer_state_from)
            self.optimizer_state_from = None
        return super().create_scheduler(num_training_steps, optimizer)


def _input_model(stage) -> str | None:
    return getattr(stage.model_args, "model_name_or_path", None) or getattr(stage.args, "model_name_or_path", None)


def check_stage(stage) -> None:
    """Before any work: the optimizer_state/ folder to continue, checked, kept as `stage.optimizer_state`."""
    args = stage.args
    stage.optimizer_state = None
    if (args.load_optimizer_state or args.optimizer_state_from) and getattr(stage.model_args, "use_peft", False):
        raise RecipeError("optimizer_state_from continues a full model's AdamW state: not with LoRA (use_peft)")
    if args.load_optimizer_state:
        stage.optimizer_state = check_optimizer_state(Path(_input_model(stage) or "") / OPTIMIZER_DIR)
    if args.optimizer_state_from:
        folder = Path(args.optimizer_state_from) / OPTIMIZER_DIR
        stage.optimizer_state = check_optimizer_state(folder, "optimizer_state_from")


def save_stage(stage, trainer) -> None:
    """Every rank writes its shards of the final AdamW state (`save_optimizer_state`), before the manifest."""
    if stage.args.save_optimizer_state:
        save_optimizer_state(trainer.model, trainer.optimizer, stage.output_dir / OPTIMIZER_DIR)


FEATURE = Feature(
    name="optimizer_state",
    settings=OptimizerStateArguments,
    trainer_mixin=ContinueOptimizerStateMixin,
    check=check_stage,
    trainer_kwargs=lambda stage, data, model: {"optimizer_state_from": getattr(stage, "optimizer_state", None)},
    save_extras=save_stage,
)
