"""Reward functions as GRPO calls them: `load_reward_funcs` imports the recipe's dotted paths (`reward_funcs`) and
wraps each with `checked_reward`, which hands it the completions as text and checks what it returns: one finite
number per completion, else one line naming the function and the first bad value (a NaN, None or inf reward, a
generator, a wrong count). TRL itself reads None as "this function does not apply" and NaN as unscorable, and turns
both into advantage 0: a reward function with a bug would train nothing without a word.

A reward function may also say which reference answers it can read: an attribute `ground_truth_problem(answer) ->
str | None` (None: readable; else why not). GRPO's data preparation asks it for every row before any work
(`ground_truth_problem`), and drops the rows it cannot read, counted."""

import importlib
import inspect
import math
from collections.abc import Sequence
from numbers import Real

from instella_recipes.core import RecipeError


class RewardFunctionError(RecipeError):
    """A reward function raised or returned something other than one finite number per completion."""


def completion_text(completion) -> str:
    """TRL hands conversational completions as message lists; the graders read the assistant's text."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return completion


def bad_reward_value(value) -> str | None:
    """Why `value` is not a usable reward (None when it is a finite real number; bools count as 0/1)."""
    if value is None:
        return "None"
    if not isinstance(value, Real):
        return f"{value!r} ({type(value).__name__}, not a number)"
    if not math.isfinite(value):
        return repr(float(value))
    return None


def checked_reward(fn, name: str):
    """`fn` as TRL calls it (completions as text, the reference answers as `ground_truth`), with a failure turned
    into one clear line: which function, what it raised or returned, on which completion."""

    def reward(completions, ground_truth, **kwargs):
        texts = [completion_text(c) for c in completions]
        try:
            values = fn(texts, ground_truth, **kwargs)
        except Exception as err:  # any error of user code: the run stops with its name, not a TRL traceback
            raise RewardFunctionError(
                f"reward function {name} raised {type(err).__name__}: {err} (batch of {len(texts)} completions, first "
                f"ground truth {ground_truth[0]!r}); fix it and rerun: training resumes from the last checkpoint"
            ) from err
        return check_reward_values(values, name, len(texts))

    reward.__name__ = name.rsplit(".", 1)[-1]  # TRL logs each function's rewards under this name
    reward.dotted_name = name
    reward.ground_truth_problem = getattr(fn, "ground_truth_problem", None)
    return reward


def check_reward_values(values, name: str, count: int) -> list[float]:
    """`values` as `count` floats, else a `RewardFunctionError` naming `name` and the first bad value."""
    must = f"it must return a list of {count} finite floats, one per completion"
    if hasattr(values, "tolist") and getattr(values, "ndim", None) == 1:  # a numpy array or a torch tensor
        values = values.tolist()
    if not isinstance(values, Sequence) or isinstance(values, str | bytes):
        what = type(values).__name__
        raise RewardFunctionError(f"reward function {name} returned a {what}, not a list of numbers; {must}")
    if len(values) != count:
        raise RewardFunctionError(
            f"reward function {name} returned {len(values)} values for {count} completions; {must}"
        )
    for index, value in enumerate(values):
        problem = bad_reward_value(value)
        if problem is not None:
            raise RewardFunctionError(
                f"reward function {name} returned {problem} for completion {index} of {count}; {must} (a NaN, None or "
                f"inf reward gives its group no learning signal)"
            )
    return [float(v) for v in values]


def load_reward_funcs(names: list[str]) -> list:
    """Each dotted path imported (as TRL's own `trl/scripts/grpo.py` does), checked to be a function taking the
    arguments it is given."""
    funcs = []
    for name in names:
        if not isinstance(name, str):
            raise RecipeError(f"reward_funcs: {name!r} is not a dotted path module.function (a string)")
        module_path, _, attr = name.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module_path), attr)
        except (ImportError, AttributeError, ValueError) as err:
            raise RecipeError(
                f"reward_funcs: cannot import '{name}' ({err}); give a dotted path module.function"
            ) from None
        if not callable(fn):
            raise RecipeError(
                f"reward_funcs: {name} is a {type(fn).__name__} ({fn!r:.60}), not a function; give a dotted path to "
                f"f(completions, ground_truth, **kwargs)"
            )
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a builtin or C callable without a signature: TRL calls it all the same
            params = None
        if params is not None:
            takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
            if len(params) < 2 and not takes_kwargs:
                raise RecipeError(f"reward_funcs: {name} must take (completions, ground_truth, **kwargs)")
        funcs.append(checked_reward(fn, name))
    return funcs


def ground_truth_problem(funcs: list, answer) -> str | None:
    """Why one of the reward functions `funcs` (wrapped by `checked_reward`) cannot read the reference answer `answer`
    (a line naming the function), or None when all can (functions without a `ground_truth_problem` read anything)."""
    for fn in funcs:
        check = getattr(fn, "ground_truth_problem", None)
        why = check(str(answer)) if check is not None else None
        if why is not None:
            return f"{fn.__name__} cannot read {str(answer)!r:.80} ({why})"
    return None
