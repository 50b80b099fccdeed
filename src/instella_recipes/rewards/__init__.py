"""Verified rewards for RL on math: the 0/1 answer check of the authors' Prime-RL grader (`math_grader`), usable as
a TRL reward function. Pure Python + sympy + pylatexenc; no torch."""

from .math_grader import extract_answer, grade_answer, math_equal, math_reward, reward

__all__ = ["extract_answer", "grade_answer", "math_equal", "math_reward", "reward"]
