"""`final_answer_reward`: the 0/1 check of a numeric final answer (the tiny demo's arithmetic, GSM8K-style)."""

import re

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")
ANSWER_IS = re.compile(r"answer is:?\s*\$?(-?[\d,]*\.?\d+)")


def final_answer_reward(completions: list[str], ground_truth: list[str], **kwargs) -> list[float]:
    """1.0 when the completion's final answer (its last `\\boxed{}`, else the number after its last "answer is")
    equals the reference number, else 0.0. For numeric answers only (the tiny demo's arithmetic, GSM8K-style); the
    published stages grade with the authors' Prime-RL grader (`instella_recipes.rewards.reward`)."""
    scores = []
    for text, truth in zip(completions, ground_truth, strict=True):
        found = BOXED.findall(text) or ANSWER_IS.findall(text)
        scores.append(float(bool(found) and _as_number(found[-1]) == _as_number(str(truth))))
    return scores


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip().rstrip("."))
    except ValueError:
        return None
