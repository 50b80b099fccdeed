"""Rewards for RL: the verified 0/1 answer check of the authors' Prime-RL grader (`math_grader`), usable as a TRL
reward function; the numeric final-answer check of the tiny demo (`final_answer`); and how GRPO loads and checks the
recipe's `reward_funcs` (`checked`). Pure Python + sympy + pylatexenc; no torch."""

from .checked import RewardFunctionError, checked_reward, completion_text, ground_truth_problem, load_reward_funcs
from .final_answer import final_answer_reward
from .math_grader import extract_answer, grade_answer, math_equal, math_reward, reward

__all__ = [
    "RewardFunctionError",
    "checked_reward",
    "completion_text",
    "extract_answer",
    "final_answer_reward",
    "grade_answer",
    "ground_truth_problem",
    "load_reward_funcs",
    "math_equal",
    "math_reward",
    "reward",
]
