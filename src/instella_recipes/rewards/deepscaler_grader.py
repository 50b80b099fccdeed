"""The answer check of Instella-Math's evaluation: DeepScaleR's `grade_answer_verl` (the authors' eval copy,
AMD-AIG-AIMA/Instella-Math `evals/deepscaler/rewards/math_utils/utils.py`, called by `evals/verl_amd/verl/utils/
reward_score/math.py` `compute_score` for every benchmark but TTT-Bench).

The last `\\boxed{...}` of the whole response (no "answer is" fallback, no `\\fbox`, content not stripped) against the
ground truth (itself un-boxed if boxed), equal under MATH normalisation or prm800k's sympy rules; DeepScaleR's copy of
those rules differs from Prime-RL's (`math_grader`) only in `_normalize` (no "liter" unit; spaces and braces dropped),
so the shared steps are reused from there. Their sympy check has no time limit; ours keeps the 10 s CPU budget of
`math_grader` (a step over it counts as "not equal"). `tests/unit/rewards/test_deepscaler_grader.py` checks the
verdicts against a test-only copy of their file.
"""

from functools import partial

from .math_grader import _UNITS, _warm_up, grade_answer, prm_normalize

_normalize = partial(prm_normalize, units=tuple(u for u in _UNITS if u != "liter"), squeeze=True)


def extract_boxed(passage: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced from that `\\boxed`), or None."""
    if "\\boxed" not in passage:
        return None
    start = passage.rfind("\\boxed")
    depth = 0
    for i in range(start, len(passage)):
        if passage[i] == "{":
            depth += 1
        elif passage[i] == "}":
            depth -= 1
            if depth == 0:
                head = "\\boxed{"
                return passage[start + len(head) : i] if passage.startswith(head, start) else None
    return None


def grade_answer_verl(solution: str, ground_truth: str) -> bool:
    """DeepScaleR's `grade_answer_verl`: the response's last boxed answer equals the ground truth."""
    if not ground_truth:
        return False
    _warm_up()
    if "\\boxed" in ground_truth:
        ground_truth = extract_boxed(ground_truth)
    given = extract_boxed(solution)
    if given is None:
        return False
    return grade_answer(given, ground_truth, normalize=_normalize)


def eval_score(solution: str, ground_truth) -> float:
    """`verl.utils.reward_score.math.compute_score` of the authors' eval: 1.0 / 0.0, an error counts as 0.0; a list
    or array ground truth (Minerva, OlympiadBench rows) is its first element."""
    if isinstance(ground_truth, list | tuple):
        ground_truth = ground_truth[0]
    try:
        return 1.0 if grade_answer_verl(solution, str(ground_truth)) else 0.0
    except Exception:
        return 0.0
