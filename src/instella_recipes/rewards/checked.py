"""Reward functions as GRPO calls them: `load_reward_funcs` imports the recipe's dotted paths (`reward_funcs`) and
wraps each with `checked_reward`, which hands it the completions as text and turns a failure into one clear line."""

import importlib
import inspect

from instella_recipes.core import RecipeError


class RewardFunctionError(RecipeError):
    """A reward function raised or returned something other than one number per completion."""


def completion_text(completion) -> str:
    """TRL hands conversational completions as message lists; the graders read the assistant's text."""
    if isinstance(completion, list):
        return "".join(m.get("content") or "" for m in completion if isinstance(m, dict))
    return completion


def checked_reward(fn, name: str):
    """`fn` as TRL calls it (completions as text, the reference answers as `ground_truth`), with a failure turned
    into one clear line: which function, what it raised, on which completion."""

    def reward(completions, ground_truth, **kwargs):
        texts = [completion_text(c) for c in completions]
        try:
            values = fn(texts, ground_truth, **kwargs)
        except Exception as err:  # any error of user code: the run stops with its name, not a TRL traceback
            raise RewardFunctionError(
                f"reward function {name} raised {type(err).__name__}: {err} (batch of {len(texts)} completions, first "
                f"ground truth {ground_truth[0]!r}); fix it and rerun: training resumes from the last checkpoint"
            ) from err
        bad = [v for v in values if v is not None and not isinstance(v, int | float)]
        if len(values) != len(texts) or bad:
            raise RewardFunctionError(
                f"reward function {name} returned {len(values)} values for {len(texts)} completions"
                + (f" (not numbers: {bad[:3]!r})" if bad else "")
                + "; it must return one float (or None) per completion"
            )
        return [None if v is None else float(v) for v in values]

    reward.__name__ = name.rsplit(".", 1)[-1]
    return reward


def load_reward_funcs(names: list[str]) -> list:
    """Each dotted path imported (as TRL's own `trl/scripts/grpo.py` does), checked for the argument it needs."""
    funcs = []
    for name in names:
        module_path, _, attr = name.rpartition(".")
        try:
            fn = getattr(importlib.import_module(module_path), attr)
        except (ImportError, AttributeError, ValueError) as err:
            raise RecipeError(
                f"reward_funcs: cannot import '{name}' ({err}); give a dotted path module.function"
            ) from None
        params = inspect.signature(fn).parameters
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
        if len(params) < 2 and not takes_kwargs:
            raise RecipeError(f"reward_funcs: {name} must take (completions, ground_truth, **kwargs)")
        funcs.append(checked_reward(fn, name))
    return funcs
