"""Bad-input policy for post-training data, applied before any training step, with every change counted.

Per row (skipped and counted, never silently changed):
- a message whose role is not system / user / assistant ("unknown role"), or whose content is not a string;
- a conversation without an assistant turn ("no assistant turn": nothing to train);
- DPO: a pair left without a scored token in its chosen or rejected conversation by the `max_length` cut (as
  open-instruct's `dpo_tune.py` drops them). Pairs with chosen == rejected and empty assistant messages are kept, as
  the authors keep them (SFT too: an empty assistant message trains its EOS).
Longer than `max_length` (`overlong` policy): "truncate" (the published way: keep the first `max_length` tokens,
as the authors' SFT preprocessing and open-instruct's DPO encoding do) counts the row as truncated; "drop" skips it.
An SFT row left without any trained token by truncation is skipped.

A dataset without `messages` (SFT) or `chosen`/`rejected` (DPO) is an error before any work (see `mixture.py`). If
more than `max_skip_fraction` of the rows are skipped, that is an error too (the data is probably in the wrong
format); otherwise the counts are printed and stored in the output manifest. `tokenization.py` applies this policy
while it tokenizes (`prepare_sft_dataset`, `prepare_dpo_dataset`).
"""

from collections import Counter
from dataclasses import dataclass, field

from instella_recipes.core import RecipeError

from .template import ROLES

OVERLONG_POLICIES = ("truncate", "drop")
OK, TRUNCATED = "ok", "ok (truncated to max_length)"


@dataclass
class DataReport:
    """Row counts of one prepared dataset: kept, truncated, and skipped by reason."""

    stage: str
    total: int = 0
    statuses: Counter = field(default_factory=Counter)

    @property
    def kept(self) -> int:
        return self.statuses[OK] + self.statuses[TRUNCATED]

    @property
    def skipped(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.statuses.items()) if k not in (OK, TRUNCATED)}

    def as_dict(self) -> dict:
        return {"rows": self.total, "kept": self.kept, "truncated": self.statuses[TRUNCATED], "skipped": self.skipped}

    def summary(self) -> str:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in self.skipped.items()) or "none"
        return (
            f"[{self.stage} data] {self.total} rows: kept {self.kept} "
            f"(truncated to max_length: {self.statuses[TRUNCATED]}); skipped: {skipped}"
        )

    def check(self, max_skip_fraction: float) -> None:
        n_skipped = sum(self.skipped.values())
        if self.kept == 0 or n_skipped > max_skip_fraction * self.total:
            raise RecipeError(
                f"{self.summary()}. More than max_skip_fraction={max_skip_fraction} of the rows are unusable: check "
                f"the source format and its converter (or raise max_skip_fraction if this is expected)."
            )


def message_problem(messages) -> str | None:
    """Why a conversation cannot be trained on, or None."""
    if not isinstance(messages, list) or not messages:
        return "not a list of messages"
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            return "unknown role"
        if not isinstance(m.get("content"), str):
            return "content is not a string"
    assistant = [m for m in messages if m["role"] == "assistant"]
    if not assistant:
        return "no assistant turn"
    return None


def check_overlong_policy(overlong: str) -> None:
    if overlong not in OVERLONG_POLICIES:
        raise RecipeError(f"overlong must be one of {OVERLONG_POLICIES}, not '{overlong}'")


def pair_problem(chosen, rejected) -> str | None:
    """Why a preference pair (two whole conversations) cannot be trained on, or None."""
    if not (isinstance(chosen, list) and isinstance(rejected, list)):
        return "not conversational (prompt/chosen/rejected must be message lists)"
    for conversation in (chosen, rejected):
        problem = message_problem(conversation)
        if problem:
            return problem
    return None
