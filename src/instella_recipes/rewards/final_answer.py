"""`final_answer_reward`: the 0/1 check of a numeric final answer (the tiny demo's arithmetic, GSM8K-style)."""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
NUMBER = r"(-?[\d,]*\.?\d+)"
# the number after "answer is" or after GSM8K's "####" (its answers end "... #### 5"); the last one counts
STATED = re.compile(rf"(?:answer is:?\s*\$?|####\s*\$?){NUMBER}")
GSM8K_MARK = "####"


def final_answer_reward(completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
    """1.0 when the completion's final answer (its last `\\boxed{}`, else the number after its last "answer is" or
    "####") equals the reference number, else 0.0. A reference is a number or a GSM8K answer ("4 + 1 = 5.\\n#### 5":
    the number after its last "####"). For numeric answers only (the tiny demo's arithmetic, GSM8K); the published
    stages grade with the authors' Prime-RL grader (`instella_recipes.rewards.reward`)."""
    scores = []
    for text, truth in zip(completions, ground_truth, strict=True):
        found = BOXED.findall(text) or STATED.findall(text)
        reference = reference_number(str(truth))
        scores.append(float(bool(found) and reference is not None and _as_number(found[-1]) == reference))
    return scores


def reference_number(truth: str) -> float | None:
    """The number a reference answer states: the whole text, or what follows GSM8K's last "####"."""
    if GSM8K_MARK in truth:
        truth = truth.rsplit(GSM8K_MARK, 1)[1]
    return _as_number(truth)


def ground_truth_problem(truth: str) -> str | None:
    """None when `final_answer_reward` can read the reference answer `truth`, else why not."""
    if reference_number(truth) is None:
        return "not a number, nor a GSM8K answer ending '#### <number>'"
    return None


final_answer_reward.ground_truth_problem = ground_truth_problem


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").replace("$", "").strip().rstrip("."))
    except ValueError:
        return None
