"""`Feature`, what a training feature module declares, and the lifecycle's helpers that run the hooks of a stage's
features in their declared order (the package docstring says how a stage composes them)."""

from collections.abc import Callable
from dataclasses import dataclass


def _nothing(*_args, **_kwargs):
    return None


def _no_fields(*_args, **_kwargs) -> dict:
    return {}


@dataclass(frozen=True)
class Feature:
    """One training feature (module docstring): its name, its settings and Trainer mixins, and its hooks."""

    name: str
    settings: type | None = None
    trainer_mixin: type | None = None
    check: Callable = _nothing  # (stage) -> None: before any work
    check_data: Callable = _nothing  # (stage, data) -> None: after the data loaded, before the model
    trainer_kwargs: Callable = _no_fields  # (stage, data, model) -> the mixin's keyword arguments
    save_extras: Callable = _nothing  # (stage, trainer) -> None: every rank, before the manifest
    manifest_fields: Callable = _no_fields  # (stage, trainer) -> dict


def settings_mixins(features) -> tuple[type, ...]:
    """The features' settings mixins, in the declared order (bases of the stage's settings class)."""
    return tuple(f.settings for f in features if f.settings is not None)


def trainer_mixins(features) -> tuple[type, ...]:
    """The features' Trainer mixins, in the declared order (bases of the stage's Trainer class)."""
    return tuple(f.trainer_mixin for f in features if f.trainer_mixin is not None)


def run_checks(stage) -> None:
    """Every feature's checks before any work (the lifecycle calls it right after `stage.check()`)."""
    for feature in stage.features:
        feature.check(stage)


def run_data_checks(stage, data) -> None:
    """Every feature's checks of the loaded data, before the model loads."""
    for feature in stage.features:
        feature.check_data(stage, data)


def trainer_kwargs(stage, data, model) -> dict:
    """The keyword arguments of the features' Trainer mixins for this run (the stage passes them to its Trainer)."""
    out = {}
    for feature in stage.features:
        out.update(feature.trainer_kwargs(stage, data, model))
    return out


def save_extras(stage, trainer) -> None:
    for feature in stage.features:
        feature.save_extras(stage, trainer)


def manifest_fields(stage, trainer) -> dict:
    out = {}
    for feature in stage.features:
        out.update(feature.manifest_fields(stage, trainer))
    return out
