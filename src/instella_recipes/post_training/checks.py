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

Rows without a training signal (SFT: every assistant message empty, so only the turn's end is trained; DPO: chosen
and rejected the same tokens, so the loss has no gradient) are kept and counted, as the authors keep single ones. A
mixture in which no kept row carries a signal is an error (`allow_no_signal: true` trains on it anyway), and more than
`NO_SIGNAL_WARN` of them a warning.

A dataset without `messages` (SFT) or `chosen`/`rejected` (DPO) is an error before any work (see `mixture.py`). If
more than `max_skip_fraction` of the rows are skipped, that is an error too (the data is probably in the wrong
format); otherwise the counts are printed and stored in the output manifest. `tokenization.py` applies this policy
while it tokenizes (`prepare_sft_dataset`, `prepare_dpo_dataset`).
"""

from collections import Counter
from dataclasses import dataclass, field

from instella_recipes.core import RecipeError, get_logger

from .template import ROLES

logger = get_logger(__name__)

OVERLONG_POLICIES = ("truncate", "drop")
OK, TRUNCATED = "ok", "ok (truncated to max_length)"
NO_SIGNAL = "ok (no training signal)"  # kept and counted: see the module docstring
KEPT = (OK, TRUNCATED, NO_SIGNAL)
NO_SIGNAL_WARN = 0.05  # a warning above this share of kept rows without a training signal
_NO_SIGNAL_WHY = {"sft": "every assistant message is empty", "dpo": "chosen and rejected are the same"}


@dataclass
class DataReport:
    """Row counts of one prepared dataset: kept, truncated, and skipped by reason."""

    stage: str
    total: int = 0
    statuses: Counter = field(default_factory=Counter)

    @property
    def kept(self) -> int:
        return sum(self.statuses[k] for k in KEPT)

    @property
    def skipped(self) -> dict[str, int]:
        return {k: v for k, v in sorted(self.statuses.items()) if k not in KEPT}

    def as_dict(self) -> dict:
        return {"rows": self.total, "kept": self.kept, "truncated": self.statuses[TRUNCATED],
                "no_signal": self.statuses[NO_SIGNAL], "skipped": self.skipped}  # fmt: skip

    def summary(self) -> str:
        skipped = ", ".join(f"{reason}: {n}" for reason, n in self.skipped.items()) or "none"
        no_signal = self.statuses[NO_SIGNAL]
        return (
            f"[{self.stage} data] {self.total} rows: kept {self.kept} "
            f"(truncated to max_length: {self.statuses[TRUNCATED]}"
            + (f"; without a training signal: {no_signal}" if no_signal else "")
            + f"); skipped: {skipped}"
        )

    def check(self, max_skip_fraction: float, allow_no_signal: bool = False) -> None:
        """A `RecipeError` when too many rows are skipped, or when no kept row carries a training signal (unless
        `allow_no_signal`); a warning when more than `NO_SIGNAL_WARN` of them carry none."""
        n_skipped = sum(self.skipped.values())
        if self.kept == 0 or n_skipped > max_skip_fraction * self.total:
            raise RecipeError(
                f"{self.summary()}. More than max_skip_fraction={max_skip_fraction} of the rows are unusable: check "
                f"the source format and its converter (or raise max_skip_fraction if this is expected)."
            )
        no_signal, why = self.statuses[NO_SIGNAL], _NO_SIGNAL_WHY.get(self.stage, "no token is trained")
        if no_signal == self.kept and not allow_no_signal:
            raise RecipeError(
                f"{self.summary()}. None of the {self.kept} kept rows carries a training signal ({why} in each): the "
                f"run would change nothing the data asks for; check the source and its converter (or pass "
                f"--allow_no_signal true to train on it anyway)"
            )
        if no_signal > NO_SIGNAL_WARN * self.kept:
            logger.warning(
                f"[{self.stage} data] {no_signal} of the {self.kept} kept rows ({no_signal / self.kept:.0%}) carry no "
                f"training signal ({why}): more than {NO_SIGNAL_WARN:.0%}; check the source and its converter"
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
