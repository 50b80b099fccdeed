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
    """Each field `names` of `obj` is > 0 (integers by default): batch sizes, steps, workers, token counts."""
    for name in names:
        check_range(name, getattr(obj, name), 0, low_open=True, integer=integer)


def check_choice(name: str, value, choices: Iterable[str]) -> None:
    """`value` is one of `choices`; otherwise a `RecipeError` listing them with the nearest one."""
    choices = list(choices)
    if value not in choices:
        hint = did_you_mean(str(value), choices)
        raise RecipeError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r} ({hint})")
