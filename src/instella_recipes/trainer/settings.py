"""What each settings field is to a run, read from the fields themselves: the run's identity, the model card's
hyperparameters and datasets, and the manifest's records all come from here, never from hand-kept key lists.

Every field a stage declares (its own, beside the library's `TrainingArguments` / `SFTConfig` / `DPOConfig` /
`ModelConfig` fields) carries `metadata={"role": ...}`:

- `run`: it defines the run (a different value in the same output_dir is a different run) and is a hyperparameter of
  the model card;
- `data`: what the run trains on (paths, mixtures); part of the identity unless the stage's data fingerprint stands
  in for it, and the model card's `datasets`;
- `launch`: how or where it runs (threads, the output location, `overwrite`): neither.

A field of ours without a role is an error (`field_roles` raises `TypeError`), so a new field cannot be missed by the
identity or the card. The library's own fields carry no such metadata: the class that uses one says which of them
define the run in its `library_roles` (`{field: role}`), where its own fields are declared: `StageSettings` the
length and seed every stage has, the optimizer feature (`trainer/features/optimizer.py`) the optimizer's, each stage's
settings class its config's own (`beta`, `num_generations`, ...), `CheckedModelConfig` the input model and LoRA.
`field_roles` merges them over the class's MRO and refuses a name the class has no field for (a library that renamed
one would silently drop it from identities and cards); every other library field is `launch`.
"""

import dataclasses
from dataclasses import dataclass, field

from instella_recipes.core.checks import check_training_arguments
from instella_recipes.trainer.checks import check_report_to

RUN, DATA, LAUNCH = "run", "data", "launch"
ROLES = (RUN, DATA, LAUNCH)


def field_roles(*settings_classes) -> dict[str, str]:
    """`{field name: role}` over the settings dataclasses (classes or instances), in declaration order. A field
    declared by any class but the library's (`LIBRARY_MODULES`) without a role in its metadata raises a
    `TypeError` naming it; library fields take their role from the classes' `library_roles` (default `launch`)."""
    roles = {}
    for cls in settings_classes:
        cls = cls if isinstance(cls, type) else type(cls)
        own, library = _own_fields(cls), library_roles(cls)
        unknown = sorted(set(library) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f"{cls.__name__}: library_roles names {unknown}, which the class has no field for")
        for f in dataclasses.fields(cls):
            role = f.metadata.get("role")
            if role is None and f.name in own:
                raise TypeError(
                    f"{own[f.name].__name__}.{f.name} has no role: add metadata={{'role': 'run' | 'data' | 'launch'}}"
                    f" (trainer/settings.py says what each means)"
                )
            if role is not None and role not in ROLES:
                raise TypeError(f"{cls.__name__}.{f.name}: role '{role}' is not one of {', '.join(ROLES)}")
            roles[f.name] = role or library.get(f.name, LAUNCH)
    return roles


def library_roles(cls) -> dict[str, str]:
    """The roles `cls` and its bases give the library's fields they use (their `library_roles`), merged."""
    out = {}
    for klass in reversed(cls.__mro__):
        out.update(vars(klass).get("library_roles", {}))
    return out


# Where the library's settings classes live: their fields take `library_roles`; every other class's must say.
LIBRARY_MODULES = ("transformers.", "trl.", "accelerate.", "peft.")


def _own_fields(cls) -> dict[str, type]:
    """The fields declared in the body of a dataclass in `cls`'s MRO that is not one of the library's, with it."""
    out = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass) and not klass.__module__.startswith(LIBRARY_MODULES):
            for name in klass.__dict__.get("__annotations__", {}):
                out[name] = klass
    return out


def values_with_role(role: str, *settings) -> dict:
    """`{name: value}` of every field with `role` over the settings instances (a later instance wins a name)."""
    out = {}
    for item in settings:
        for name, field_role in field_roles(item).items():
            if field_role == role:
                out[name] = getattr(item, name)
    return out


RESUME_HELP = (
    "auto (default): the newest complete checkpoint in output_dir, or a fresh start when there is none; a checkpoint "
    "folder: resume from it; none: start fresh. The same rule in every stage."
)


def split_report_to(value):
    """`report_to` as the Trainer reads it, a list: `tensorboard,wandb` (what the recipes' comments suggest, and how
    transformers' docs write several integrations on a command line) becomes `["tensorboard", "wandb"]`."""
    items = [value] if isinstance(value, str) else value
    if items is None:
        return None
    out = [part.strip() for item in items for part in str(item).split(",") if part.strip()]
    return out[0] if len(out) == 1 and isinstance(value, str) else out


@dataclass
class StageSettings:
    """Mixed in before the library's config class by every stage's settings class (`class PretrainArguments(
    StageSettings, TrainingArguments)`): the fields the lifecycle (`trainer/stage.py`) reads beside the library's,
    the numeric range checks (`core.checks.check_training_arguments`) and `report_to` comma lists."""

    # the library fields every stage has that define a run (per_device_train_batch_size and
    # gradient_accumulation_steps are `launch`: a run may resume on another world size with the same global batch,
    # which the identity records as `global_batch`)
    library_roles = dict.fromkeys(("num_train_epochs", "max_steps", "seed", "data_seed", "bf16"), RUN)

    resume_from_checkpoint: str | None = field(default="auto", metadata={"role": LAUNCH, "help": RESUME_HELP})
    overwrite: bool = field(
        default=False,
        metadata={"role": LAUNCH, "help": "Replace a complete output in output_dir (of any stage) from scratch."},
    )

    def __post_init__(self):
        self.report_to = split_report_to(self.report_to)
        check_report_to(self.report_to)
        check_training_arguments(self)
        super().__post_init__()
