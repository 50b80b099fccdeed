"""Reward functions for GRPO tests (dotted paths a recipe's `reward_funcs` can name)."""

import os

DIGITS = set("0123456789")


def digit_share(completions, ground_truth, **kwargs):
    """A learnable tiny task: the share of a completion's non-space characters that are digits (0..1). A random
    tiny model writes some digits by chance, so every group has a spread and GRPO can raise it within a few steps."""
    scores = []
    for text in completions:
        chars = [c for c in text if not c.isspace()]
        scores.append(sum(c in DIGITS for c in chars) / len(chars) if chars else 0.0)
    return scores


def raises(completions, ground_truth, **kwargs):
    """A reward function with a bug."""
    raise ZeroDivisionError("division by zero")


def digit_share_with_a_bug(completions, ground_truth, trainer_state=None, **kwargs):
    """`digit_share`, except that from optimizer step 2 on it raises while GRPO_TEST_REWARD_BUG is set: the same
    run (same settings, so the same identity) first fails mid-training, then, with the bug "fixed", resumes."""
    if os.environ.get("GRPO_TEST_REWARD_BUG") and trainer_state is not None and trainer_state.global_step >= 2:
        raise KeyError("missing_field")
    return digit_share(completions, ground_truth)


def always_zero(completions, ground_truth, **kwargs):
    """A reward that never varies: every group's advantages are 0, GRPO learns nothing."""
    return [0.0] * len(completions)


def returns_nan(completions, ground_truth, **kwargs):
    """A reward function with a bug: NaN for the second completion."""
    return [0.0 if i != 1 else float("nan") for i in range(len(completions))]


def returns_generator(completions, ground_truth, **kwargs):
    """A reward function that forgot its list(...)."""
    return (0.0 for _ in completions)


NOT_A_FUNCTION = 0.5  # what a recipe's reward_funcs must not name
