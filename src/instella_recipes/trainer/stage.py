"""The lifecycle every training stage runs (pretraining, SFT, DPO, GRPO, long-context phases): the only place that
knows the order. A stage is a `Stage` subclass that supplies what differs (its data, model, trainer, extra files);
`run_stage(stage)` runs it:

     1. arm pre-emption          SIGTERM/SIGUSR1 from here to the end: a checkpoint and exit 0, never a half state
     2. stage.check()            cheap input checks, nothing loaded; the output folder's location and inputs;
                                 then each of `stage.features`' checks (`trainer/features/`), in their order
     3. stage.load_data()        (the stage may add its own stop points: `self.stop_point(where)`); then the
                                 features' checks of the loaded data
        -- stop point "after loading the data"
     4. the output folder against the run's identity (`stage.identity(data)`): this very run finished -> exit 0;
        another run's manifest or checkpoints -> error; otherwise go on
     5. stage.build_model(data)
        -- stop point "after loading the model"
     6. the one resume rule (`resolve_resume`): `auto` | a checkpoint path | `none`
     7. claim the output folder (rank 0): emptied with --overwrite, a half-written `.staging` dropped, run.json pinned
     8. stage.build_trainer(data, model, callbacks)
        -- stop point "after building the trainer"
     9. trainer.train(resume_from_checkpoint=...); stage.after_train(trainer) (e.g. a divergence -> exit 3);
        pre-empted -> its checkpoint is saved, exit 0, no manifest
    10. the final save (`save_final_model`): a full state dict gathered whatever the FSDP `state_dict_type` (the DCP
        checkpoints for resume stay sharded), written by `save_pretrained` as the model's own class
    11. stage.save_extras(trainer, data), then the features' (every rank; LoRA merge, data reports, optimizer state)
    12. manifest.json last (rank 0): the common record + `stage.manifest_fields(trainer, data)` + the features'

A stage's training features (sequence parallelism, MDS streaming, the optimizer, ...) are one tuple,
`Stage.features`, from which its settings and Trainer classes derive their bases (`trainer/features/__init__.py`);
the lifecycle runs their checks and extras at the points above, and `feature_kwargs` hands their Trainer mixins what
they take.

The split follows the libraries': the Trainer (transformers / TRL) trains, checkpoints and resumes; the stage's
settings class (a subclass of the library's config) carries the recipe; this module is the short `main` that TRL's
`trl/scripts/*.py` and alignment-handbook write once per script, written once for all stages (and, like OLMo-core's
fixed loop with callbacks, features plug in as hooks and Trainer callbacks, never as a copy of the order).
"""

import hashlib
import json
import shutil
from pathlib import Path

import torch
from torch.distributed.fsdp import FSDPModule
from transformers.trainer import TRAINING_ARGS_NAME

from instella_recipes.core import (
    RecipeError,
    check_output_dir,
    claim_output_dir,
    config_path,
    file_digest,
    get_logger,
    naming_write_failures,
    read_manifest,
    resolved_arguments,
    write_manifest,
)
from instella_recipes.data.sources import source_identities
from instella_recipes.data.token_files import describe_data_change
from instella_recipes.trainer import features
from instella_recipes.trainer.callbacks import PreemptionCallback
from instella_recipes.trainer.checkpoints import STAGING, complete_checkpoints, resolve_resume
from instella_recipes.trainer.checks import check_attention, rows_per_step
from instella_recipes.trainer.settings import DATA, RUN, field_roles, values_with_role

logger = get_logger(__name__)
RUN_FILE = "run.json"  # the identity of the run whose checkpoints a folder holds (written when it is claimed)


class StoppedBeforeTraining(Exception):
    """A stop request (SIGTERM/SIGUSR1) arrived during start-up; nothing was written (`run_stage` returns 0)."""


class Stage:
    """One training stage. Subclasses set `name`, `features` (the training features, in order: `trainer/features/`),
    `settings_class` and `trainer_class` (both derived from `features`) and implement `load_data`, `build_model` and
    `build_trainer` (which passes `feature_kwargs(data, model)` to the Trainer); the other hooks have defaults. `args`
    is the stage's settings (a subclass of the library's `TrainingArguments` / `SFTConfig` / `DPOConfig` / `GRPOConfig`
    carrying the stage's own fields, among them `overwrite` and `resume_from_checkpoint`), `model_args` TRL's
    `ModelConfig` where the stage has one, `argv` the command line (recorded in the manifest)."""

    name: str = "stage"
    features: tuple = ()
    settings_class: type | None = None
    trainer_class: type | None = None

    def __init__(self, args, model_args=None, argv: list[str] | None = None):
        self.args = args
        self.model_args = model_args
        self.argv = list(argv or [])
        self.preemption: PreemptionCallback | None = None  # set by `run_stage`

    # --- what the lifecycle reads ------------------------------------------------------------------------------
    @property
    def settings(self) -> tuple:
        """The settings objects of the run (their fields make the identity, the card and the manifest)."""
        return (self.args,) if self.model_args is None else (self.args, self.model_args)

    @property
    def output_dir(self) -> Path:
        return Path(self.args.output_dir)

    @property
    def overwrite(self) -> bool:
        return bool(getattr(self.args, "overwrite", False))

    def inputs(self) -> list[tuple[str, str]]:
        """`(name, path)` of the folders the run reads, which its output_dir must be none of (nor hold)."""
        path = getattr(self.model_args, "model_name_or_path", None) or getattr(self.args, "model_name_or_path", None)
        return [("model_name_or_path", path)]

    def stop_point(self, where: str) -> None:
        """Between start-up phases: stop now (nothing written) if a stop request has arrived; the phase that just
        ran ran to its end. The lifecycle calls it between its own phases; a stage may call it inside a hook."""
        if self.preemption is not None and self.preemption.requested:
            raise StoppedBeforeTraining(where)

    def feature_kwargs(self, data, model) -> dict:
        """What the features' Trainer mixins take for this run (each feature's `trainer_kwargs`)."""
        return features.trainer_kwargs(self, data, model)

    # --- hooks -----------------------------------------------------------------------------------------------------
    def row_length(self, data=None) -> tuple[int | None, str]:
        """What every training row's length is a multiple of (None: not fixed) and the setting that fixes it; with
        `data` after it loaded (sequence parallelism splits each row into equal chunks)."""
        return None, "seq_len"

    def check(self) -> None:
        """Cheap checks before anything loads (the output folder's location and inputs are checked already)."""

    def load_data(self):
        """The training data (and whatever else the model and trainer need from it: a tokenizer, a report)."""
        raise NotImplementedError

    def build_model(self, data):
        """The model to train."""
        raise NotImplementedError

    def build_trainer(self, data, model, callbacks: list):
        """The Trainer (any `transformers.Trainer` subclass), given `callbacks` (pre-emption) to install."""
        raise NotImplementedError

    def data_fingerprint(self, data) -> str | None:
        """A digest of the training data that stands for its `data` fields in the identity (None: the fields)."""
        return None

    def data_files(self, data) -> list | None:
        """Per-file identities of the training data (`[name, size, content digest]`, optionally a 4th item naming
        the kind of file), kept beside the fingerprint so a refused resume can name the file that changed (None: no
        such list). Default: the local files of a `sources` field (SFT, DPO, GRPO: `data.sources.source_identities`),
        whose contents then join the `data` fields in the identity."""
        sources = values_with_role(DATA, *self.settings).get("sources")
        return source_identities(sources) if sources else None

    def identity(self, data) -> dict:
        """What makes this run this run (compared against the folder's run.json and manifest): every `run` field
        (`trainer/settings.py`), the `data` fields or the data fingerprint, and the global batch (not its split: a
        run may resume on another world size)."""
        identity = values_with_role(RUN, *self.settings)
        fingerprint = self.data_fingerprint(data)
        files = self.data_files(data)
        if fingerprint is None:
            identity.update(values_with_role(DATA, *self.settings))
            if files:  # the fields name the files; their contents too must be the same to resume
                identity["data_content"] = hashlib.sha256(json.dumps(files).encode()).hexdigest()
        identity["data_fingerprint"] = fingerprint
        identity["global_batch"] = rows_per_step(self.args)
        identity = json.loads(json.dumps(identity, sort_keys=True, default=_plain))
        identity["fingerprint"] = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()
        if files:  # not part of the fingerprint (the data fingerprint covers them): only to name what changed
            identity["data_files"] = files
        return identity

    def after_train(self, trainer) -> None:
        """After `trainer.train()` returned (also when pre-empted): raise `SystemExit` to fail the run."""

    def before_save(self, trainer) -> None:
        """Before the final save (not when pre-empted): put back what training changed on the model's config."""

    def save_extras(self, trainer, data) -> None:
        """Every rank, after the final model: the stage's other files (before the manifest)."""

    def manifest_fields(self, trainer, data) -> dict:
        """The stage's own manifest fields beside the common ones."""
        return {}

    def model_folder(self) -> Path:
        """Where the final `save_pretrained` writes (a LoRA stage: its adapter folder)."""
        return self.output_dir

    # --- the pieces of `run_stage`, for tests and tools that drive a stage by hand ---------------------------------
    def build(self, callbacks=()):
        """`(trainer, data)`: the hooks up to a ready trainer, without the output-folder claim or training."""
        self.check()
        features.run_checks(self)
        data = self.load_data()
        features.run_data_checks(self, data)
        return self.build_trainer(data, self.build_model(data), list(callbacks)), data

    def finish(self, trainer, data) -> Path:
        """After training: the final model, the trainer state, the stage's extras, and the manifest last."""
        finish_stage(self, trainer, data, self.identity(data))
        return self.output_dir


def _plain(value):
    """JSON for what settings hold beside plain values (enums, paths)."""
    return getattr(value, "value", None) or str(value)


def run_stage(stage: Stage) -> int:
    """Run `stage` through the lifecycle (module docstring); returns the exit code, 0 (a divergence or a bad input
    raise: `SystemExit`, `RecipeError`). SIGTERM/SIGUSR1 at any phase end it with 0 in a consistent state: during
    start-up at the next stop point with nothing written, during training with a checkpoint and no manifest (the next
    run resumes from it), during the final save after that save."""
    stage.preemption = PreemptionCallback()
    stage.preemption.install()  # takes over a request that arrived while the entry point was importing
    try:
        with naming_write_failures(lambda: str(stage.output_dir), f"{stage.name}: writing the run's files"):
            return _run(stage)
    except StoppedBeforeTraining as stop:
        logger.info(f"{stage.name}: pre-empted during start-up ({stop}); nothing was written. Rerun to start.")
        return 0
    finally:
        stage.preemption.restore()


def _run(stage: Stage) -> int:
    stage.stop_point("before loading anything")
    # the location and the inputs now, and a complete output of another stage; one of this stage waits for the
    # identity (step 4)
    output_dir = check_output_dir(stage.output_dir, overwrite=True, inputs=stage.inputs())
    done = read_manifest(output_dir)
    if done is not None and done.get("stage") != stage.name:
        check_output_dir(output_dir, stage.overwrite, inputs=stage.inputs())
    # flash_attention_2 without a GPU or flash-attn: a traceback when the model loads otherwise
    check_attention(
        getattr(stage.model_args, "attn_implementation", None) or getattr(stage.args, "attn_implementation", "")
    )
    stage.check()
    features.run_checks(stage)
    data = stage.load_data()
    features.run_data_checks(stage, data)
    stage.stop_point("after loading the data")
    identity = stage.identity(data)
    if check_run_dir(stage.name, output_dir, identity, stage.overwrite, stage.inputs()) is not None:
        logger.info(f"{stage.name}: {output_dir} already holds this finished run; nothing to do")
        return 0
    model = stage.build_model(data)
    stage.stop_point("after loading the model")
    # a complete output still here is one --overwrite replaces: claim_run_dir empties it, so none of its checkpoints
    replacing = read_manifest(output_dir) is not None
    resume = None if replacing else resolve_resume(stage.args.resume_from_checkpoint, output_dir)
    if stage.args.process_index == 0:
        claim_run_dir(output_dir, identity, stage.overwrite, stage.inputs())
    trainer = stage.build_trainer(data, model, [stage.preemption])
    stage.stop_point("after building the trainer")
    if resume:
        logger.info(f"{stage.name}: resuming from {resume}")
    trainer.train(resume_from_checkpoint=resume)
    stage.after_train(trainer)
    if stage.preemption.preempted:
        logger.info(f"{stage.name}: pre-empted; saved checkpoint-{trainer.state.global_step}. Rerun to resume.")
        return 0
    with naming_write_failures(output_dir, f"{stage.name}: saving the final model"):
        finish_stage(stage, trainer, data, identity)
    logger.info(f"{stage.name}: model written to {output_dir}")
    return 0


def finish_stage(stage: Stage, trainer, data, identity: dict) -> None:
    """Steps 10-12 (every rank): the final model, the trainer state, the stage's extras, then the manifest."""
    stage.before_save(trainer)
    save_final_model(trainer, stage.model_folder())
    trainer.save_state()
    stage.save_extras(trainer, data)
    features.save_extras(stage, trainer)
    if trainer.is_world_process_zero():
        write_manifest(stage.output_dir, stage.name, **common_manifest_fields(stage, trainer, identity, data))


def check_run_dir(name: str, output_dir: Path, identity: dict, overwrite: bool = False, inputs=()) -> dict | None:
    """None to go on; the finished manifest when this very run is already complete there (and not `overwrite`).
    Another complete output follows the rule of `core.io.check_output_dir` (replaced only with `overwrite`); another
    run's checkpoints raise (an interrupted run of this recipe resumes, with or without `overwrite`); a folder is
    another run's only once that run wrote a manifest or a checkpoint."""
    manifest = read_manifest(output_dir)
    same = manifest is not None and manifest.get("stage") == name
    if same and manifest.get("run", {}).get("fingerprint") == identity["fingerprint"] and not overwrite:
        return manifest
    if same and not overwrite:
        raise RecipeError(
            f"output_dir {output_dir} holds a complete '{name}' output of a different recipe, data or seed "
            f"(manifest.json, finished {manifest.get('finished_at')}); choose another output_dir, or pass --overwrite "
            f"true to replace it"
        )
    check_output_dir(output_dir, overwrite, inputs=inputs)
    if manifest is not None:  # replaced with --overwrite: emptied by claim_run_dir, before the first byte
        return None
    run_file = output_dir / RUN_FILE
    if run_file.is_file() and not complete_checkpoints(output_dir):
        # A run that stopped before its first checkpoint left nothing to resume: it does not pin the folder.
        logger.info(f"{name}: {output_dir} holds no checkpoint of its earlier run; starting this run there")
        return None
    if run_file.is_file():
        previous = json.loads(run_file.read_text())
        if previous.get("fingerprint") != identity["fingerprint"]:
            details = ("fingerprint", "data_files")
            changed = sorted(k for k in identity if k not in details and previous.get(k) != identity[k])
            detail = describe_data_change(previous.get("data_files"), identity.get("data_files"))
            raise RecipeError(
                f"output_dir {output_dir} holds checkpoints of a different run (changed: {', '.join(changed)}"
                f"{detail}); resume with the same recipe and data or choose another output_dir"
            )
    elif complete_checkpoints(output_dir):
        raise RecipeError(
            f"output_dir {output_dir} holds checkpoints of an unknown run (no {RUN_FILE}); resume them with the "
            f"recipe that wrote them from another copy, or choose another output_dir"
        )
    return None


def claim_run_dir(output_dir: Path, identity: dict, overwrite: bool, inputs) -> None:
    """Rank 0, just before the trainer writes: claim the folder (the rule of `core.io`: with --overwrite a complete
    output is emptied, manifest first), drop a half-written `.staging` checkpoint of a killed run (never resumed
    from) and pin the run (run.json)."""
    claim_output_dir(output_dir, overwrite, inputs=inputs)
    shutil.rmtree(output_dir / STAGING, ignore_errors=True)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / RUN_FILE).write_text(json.dumps(identity, indent=2) + "\n")


def save_final_model(trainer, folder: Path) -> None:
    """The trained model as one `save_pretrained` folder (every rank calls it). Under FSDP the full state dict is
    gathered with accelerate's `get_state_dict` whatever the plugin's `state_dict_type` (transformers' `save_model`
    writes nothing under `SHARDED_STATE_DICT`, which the periodic DCP checkpoints keep); the main process writes it
    with the model's own class (`own_class`), then the processing class and the training arguments, as
    `Trainer.save_model` does."""
    folder = Path(folder)
    state_dict = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled else None
    if trainer.args.should_save:
        model = trainer.accelerator.unwrap_model(trainer.model, keep_torch_compile=False)
        folder.mkdir(parents=True, exist_ok=True)
        with own_class(model):
            model.save_pretrained(folder, state_dict=state_dict)
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(folder)
        torch.save(trainer.args, folder / TRAINING_ARGS_NAME)  # as `Trainer.save_model` writes it
    trainer.accelerator.wait_for_everyone()


class own_class:
    """While saving: the model as its own class. FSDP2's `fully_shard` swaps a module's class for a generated
    subclass defined in torch (`FSDP<Name>`), and `save_pretrained` of a model registered for an Auto class copies the
    source of the object's class module as remote code: torch's FSDP files, and an `auto_map` naming the generated
    class. The state dict is already gathered, so nothing FSDP does is needed during the save."""

    def __init__(self, model):
        self.model = model
        self.saved = type(model)

    def __enter__(self):
        if isinstance(self.model, FSDPModule):
            self.model.__class__ = next(c for c in self.saved.__mro__[1:] if not issubclass(c, FSDPModule))
        return self.model

    def __exit__(self, *exc):
        self.model.__class__ = self.saved
        return False


def common_manifest_fields(stage: Stage, trainer, identity: dict, data) -> dict:
    """What every stage's manifest records: the recipe, the command line, the resolved settings and their
    hyperparameters (the `run` fields) and datasets (the `data` fields), the run identity, seed, world size, steps
    and the final loss; then the stage's own fields."""
    recipe = config_path(stage.argv)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    groups = dict(zip(("training", "model"), stage.settings))
    return {
        "run": identity,
        "recipe": str(recipe) if recipe else None,
        "recipe_sha256": file_digest(recipe) if recipe and recipe.is_file() else None,
        "argv": stage.argv,
        "arguments": resolved_arguments(**groups),
        "hyperparameters": json.loads(json.dumps(values_with_role(RUN, *stage.settings), default=_plain)),
        "datasets": json.loads(json.dumps(values_with_role(DATA, *stage.settings), default=_plain)),
        "seed": trainer.args.seed,
        "world_size": trainer.args.world_size,
        "global_step": trainer.state.global_step,
        "final_loss": losses[-1] if losses else None,
        **stage.manifest_fields(trainer, data),
        **features.manifest_fields(stage, trainer),
    }


__all__ = [
    "RUN_FILE",
    "Stage",
    "StoppedBeforeTraining",
    "check_run_dir",
    "claim_run_dir",
    "field_roles",
    "resolve_resume",
    "run_stage",
    "save_final_model",
]
