"""Whether GRPO learns anything: a group of completions whose rewards are all equal has advantage 0 for every
completion, so a rollout batch in which every group is such a group passes no gradient (only the small KL term acts).
A reward function that always returns the same value (all 0: the model never answers right, or the reward cannot
read the answers) makes a whole run of such steps, and TRL reports it only as a logged `frac_reward_zero_std` of 1.

`RewardSignal` watches the rewards of every training rollout batch (`InstellaGRPOTrainer` feeds it): a stretch of
`WARN_AFTER` batches without a signal is a warning in the log; `no_signal_error` at the end of training is the one
line of a run that had none at any step (the stage then fails, as SFT/DPO fail on data that trains nothing,
`post_training/checks.py`; `allow_no_signal: true` lets it finish)."""

import math

import torch

from instella_recipes.core import get_logger

logger = get_logger(__name__)
WARN_AFTER = 10  # rollout batches in a row without a learning signal before a warning
ZERO_STD = "frac_reward_zero_std"  # TRL's logged share of groups whose rewards are all equal


class RewardSignal:
    """Per reward function the range of its rewards, and the rollout batches with and without a learning signal."""

    def __init__(self, names: list[str], warn_after: int = WARN_AFTER):
        self.names = list(names)
        self.warn_after = warn_after
        self.low = [math.inf] * len(self.names)
        self.high = [-math.inf] * len(self.names)
        self.batches = 0
        self.with_signal = 0
        self.stretch = 0  # batches in a row without a signal, up to now

    def observe(self, rewards_per_func: torch.Tensor, rewards: torch.Tensor, num_generations: int, step: int) -> None:
        """One rollout batch: `rewards_per_func` (completions x functions), `rewards` their weighted sum, grouped by
        `num_generations` consecutive completions (TRL's layout)."""
        values = rewards_per_func.detach().float().cpu()
        for column, _ in enumerate(self.names):
            finite = values[:, column][torch.isfinite(values[:, column])]
            if finite.numel():
                self.low[column] = min(self.low[column], finite.min().item())
                self.high[column] = max(self.high[column], finite.max().item())
        self.batches += 1
        if has_signal(rewards, num_generations):
            self.with_signal += 1
            self.stretch = 0
            return
        self.stretch += 1
        if self.stretch == self.warn_after:
            logger.warning(
                f"[grpo] no learning signal for {self.stretch} rollout batches in a row (up to step {step}): every "
                f"group's rewards are equal, so every advantage is 0; {self.describe()}"
            )

    def describe(self) -> str:
        """The reward functions and the range of their values so far, as one phrase."""
        parts = []
        for name, low, high in zip(self.names, self.low, self.high, strict=True):
            seen = f"values {low:g}..{high:g}" if low <= high else "no finite value"
            parts.append(f"{name} ({seen})")
        return "reward functions: " + ", ".join(parts)

    def no_signal_error(self, log_history: list[dict]) -> str | None:
        """The line for a run that had no learning signal at any step, else None. The logged `frac_reward_zero_std`
        (kept in the checkpoints, so it covers the steps before a resume) decides where the run logged it; the
        batches seen by this process otherwise."""
        logged = [entry[ZERO_STD] for entry in log_history if ZERO_STD in entry]
        if logged:
            silent = all(value >= 1.0 for value in logged)
        else:
            silent = self.batches > 0 and self.with_signal == 0
        if not silent:
            return None
        return (
            f"GRPO learned nothing: at every step each group's rewards were equal (or not finite), so every advantage "
            f"was 0; {self.describe()}. Check that the reward functions can score these completions (answer_column, "
            f"the completion format) or set allow_no_signal: true; nothing was saved as complete"
        )


def has_signal(rewards: torch.Tensor, num_generations: int) -> bool:
    """Some group of `num_generations` completions has finite rewards that are not all equal (TRL's `isclose` of the
    group's std to 0 decides "equal" for its `frac_reward_zero_std`; the same here on the range)."""
    grouped = rewards.detach().float().view(-1, num_generations)
    finite = torch.isfinite(grouped)
    high = torch.where(finite, grouped, -math.inf).amax(dim=1)
    low = torch.where(finite, grouped, math.inf).amin(dim=1)
    usable = finite.sum(dim=1) >= 2
    spread = ~torch.isclose(high - low, torch.zeros_like(high)) & usable
    return bool(spread.any())
