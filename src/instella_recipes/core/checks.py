"""Range and type checks for numeric recipe fields, called from each argument dataclass's `__post_init__`.

A recipe value outside its range (a negative learning rate, zero batches, `max_length -1`, DPO `beta -5`) would
otherwise train, skip or silently truncate and still be marked complete. Each check raises a `RecipeError` that
names the field, the allowed range and the value; `parse_recipe` prefixes the recipe file (or "command line").
"""

import math
from collections.abc import Iterable
from numbers import Integral, Real

from .errors import RecipeError, did_you_mean


def _describe(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_range(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
    hint: str = "",
) -> None:
    """`value` must be a finite number (an integer with `integer=True`) within `low..high` (inclusive unless
    `low_open`/`high_open`; `None` = unbounded); `None` itself only with `allow_none`. Otherwise a `RecipeError`:
    `<name> must be <range>, got <value>` plus `hint`."""
    if value is None and allow_none:
        return
    kind = "an integer" if integer else "a number"
    wanted = _describe(low, high, low_open, high_open) if (low is not None or high is not None) else kind
    suffix = f" ({hint})" if hint else ""
    numeric = isinstance(value, Integral if integer else Real) and not isinstance(value, bool)
    if not numeric or not math.isfinite(value):
        raise RecipeError(f"{name} must be {kind} {wanted}, got {value!r}{suffix}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise RecipeError(f"{name} must be {wanted}, got {value!r}{suffix}")


def check_positive(obj, *names: str, integer: bool = True) -> None:
    """Each field `names` of `obj` is >= 1 (integers, the default: batch sizes, steps, workers, token counts) or
    > 0 (`integer=False`)."""
    for name in names:
        if integer:
            check_range(name, getattr(obj, name), 1, integer=True)
        else:
            check_range(name, getattr(obj, name), 0, low_open=True)


def check_choice(name: str, value, choices: Iterable[str]) -> None:
    """`value` is one of `choices`; otherwise a `RecipeError` listing them with the nearest one."""
    choices = list(choices)
    if value not in choices:
        hint = did_you_mean(str(value), choices)
        raise RecipeError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r} ({hint})")


def _check_optional(args, name: str, *range_args, **range_kwargs) -> None:
    if hasattr(args, name):
        check_range(name, getattr(args, name), *range_args, **range_kwargs)


def check_training_arguments(args) -> None:
    """The numeric fields our recipes set on transformers' `TrainingArguments` (and TRL's configs, which extend it):
    each one in its range, before the Trainer sees it. Fields a class does not have are skipped."""
    check_range("learning_rate", args.learning_rate, 0, hint="0 keeps the weights as they are")
    check_positive(args, "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    check_range("max_steps", args.max_steps, -1, integer=True, hint="-1 trains for num_train_epochs")
    if args.max_steps == 0:
        raise RecipeError("max_steps must be >= 1, or -1 to train for num_train_epochs, got 0 (nothing would train)")
    if args.max_steps < 0:
        check_range("num_train_epochs", args.num_train_epochs, 0, low_open=True, hint="or set max_steps")
    check_range("warmup_steps", args.warmup_steps, 0)
    check_range("weight_decay", args.weight_decay, 0)
    check_range("adam_beta1", args.adam_beta1, 0, 1, high_open=True)
    check_range("adam_beta2", args.adam_beta2, 0, 1, high_open=True)
    check_range("adam_epsilon", args.adam_epsilon, 0, low_open=True)
    check_range("max_grad_norm", args.max_grad_norm, 0, hint="0 turns clipping off")
    check_range("seed", args.seed, 0, integer=True)
    for name in ("logging_steps", "save_steps", "eval_steps"):
        _check_optional(args, name, 0, low_open=True, allow_none=True, hint="a step count, or a fraction < 1")
    _check_optional(args, "save_total_limit", 1, integer=True, allow_none=True)
    _check_optional(args, "max_length", 1, integer=True, allow_none=True, hint="tokens per row; None: no limit")
    _check_optional(args, "max_prompt_length", 1, integer=True, allow_none=True)
    _check_optional(args, "beta", 0, low_open=True, hint="the DPO temperature")
    _check_optional(args, "label_smoothing", 0, 0.5, high_open=True)
