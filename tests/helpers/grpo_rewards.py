"""Reward functions for GRPO tests (dotted paths a recipe's `reward_funcs` can name)."""

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


def raises_after_two_steps(completions, ground_truth, trainer_state=None, **kwargs):
    """`digit_share` for the first two optimizer steps, then a bug (a run that must stop and resume)."""
    if trainer_state is not None and trainer_state.global_step >= 2:
        raise KeyError("missing_field")
    return digit_share(completions, ground_truth)
