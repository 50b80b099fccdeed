"""Training features: one module each, composed by every stage from one declared list.

A training feature is what a stage may add to the library's Trainer: sequence parallelism, MDS streaming, another
run's AdamW state, the loss reduction, Instella's optimizer and schedule, the fp32 gradient reduce. Its module holds
all of it and ends with `FEATURE = Feature(...)`, which names

- `settings`: its recipe fields, a dataclass mixin of the stage's settings class (checked at parse time in its
  `__post_init__`);
- `check(stage)`: its checks before any work (the lifecycle runs them right after `stage.check()`, before the stop
  point "before loading the data"), and `check_data(stage, data)` after the data loaded, before the model does;
- `trainer_mixin`: its Trainer hooks, a mixin of the stage's Trainer class;
- `trainer_kwargs(stage, data, model)`: what the mixin's `__init__` takes from the run;
- `save_extras(stage, trainer)` and `manifest_fields(stage, trainer)`: its files beside the model and its manifest
  fields.

A stage declares its features in ONE tuple, in an explicit order (the first is the outermost Trainer mixin: it sees a
hook first and calls the next with `super()`), and derives both classes from it:

    FEATURES = (sequence_parallel.FEATURE, fp32_reduce.FEATURE, optimizer.FEATURE)

    @dataclass
    class MySettings(StageSettings, *settings_mixins(FEATURES), TrainingArguments): ...

    class MyTrainer(*trainer_mixins(FEATURES), Trainer): ...

    class MyStage(Stage):
        features = FEATURES
        settings_class, trainer_class = MySettings, MyTrainer

so adding a feature to a stage is one line of that tuple. The classes are written out (not made by `type()` at run
time) so they pickle, show in tracebacks under their names and read as any other class; `check_composition` (run by
`tests/unit/repo/test_training_features.py` on every stage) proves they follow the tuple and that each stage carries
the features every training stage must (`REQUIRED`). The design is OLMo-core's callbacks and torchtitan's components:
a fixed loop (here the Trainer's and `trainer/stage.py`'s) with the features plugged in at named points.
"""

from . import dynamic_batching, fp32_reduce, loss_reduction, mds_streams, optimizer, optimizer_state, sequence_parallel
from .feature import (
    Feature,
    manifest_fields,
    run_checks,
    run_data_checks,
    save_extras,
    settings_mixins,
    trainer_kwargs,
    trainer_mixins,
)

ALL = (
    mds_streams.FEATURE,
    sequence_parallel.FEATURE,
    optimizer_state.FEATURE,
    fp32_reduce.FEATURE,
    optimizer.FEATURE,
    loss_reduction.FEATURE,
    dynamic_batching.FEATURE,
)
# What every training stage carries (tests/unit/repo/test_training_features.py): the authors' optimizer (decay on
# every parameter, the schedule's step indexing) and the fp32 gradient reduce under FSDP + bf16.
REQUIRED = (optimizer.FEATURE, fp32_reduce.FEATURE)


def check_composition(stage_class) -> list[str]:
    """What is wrong with how `stage_class` composes its features (empty: nothing): every feature of `REQUIRED`
    declared, and the settings and Trainer classes carrying exactly the declared mixins in the declared order."""
    features = tuple(stage_class.features)
    problems = [f"{stage_class.__name__} lacks the feature '{f.name}' every training stage carries"
                for f in REQUIRED if f not in features]  # fmt: skip
    for role, cls, mixins in (
        ("settings_class", stage_class.settings_class, settings_mixins(features)),
        ("trainer_class", stage_class.trainer_class, trainer_mixins(features)),
    ):
        if cls is None:
            problems.append(f"{stage_class.__name__}.{role} is not set")
            continue
        every = set(settings_mixins(ALL) if role == "settings_class" else trainer_mixins(ALL))
        found = tuple(k for k in cls.__mro__ if k in every)
        if found != mixins:
            problems.append(
                f"{stage_class.__name__}.{role} {cls.__name__} carries {[k.__name__ for k in found]}, its features "
                f"declare {[k.__name__ for k in mixins]} (derive its bases from the stage's feature tuple)"
            )
    return problems


__all__ = [
    "ALL",
    "REQUIRED",
    "Feature",
    "check_composition",
    "manifest_fields",
    "run_checks",
    "run_data_checks",
    "save_extras",
    "settings_mixins",
    "trainer_kwargs",
    "trainer_mixins",
]
