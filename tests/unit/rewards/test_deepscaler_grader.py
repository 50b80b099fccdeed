"""The evaluation's answer check gives DeepScaleR's `grade_answer_verl` verdicts (the authors' eval copy at
AMD-AIG-AIMA/Instella-Math 65534d3, copied test-only into tests/helpers/deepscaler_oracle/) on the reward test's
handmade and real-format answers, plus boxed ground truths and what only this grader treats differently."""

from instella_recipes.rewards.deepscaler_grader import eval_score, grade_answer_verl
from tests.helpers.deepscaler_oracle.math_utils import grade_answer_verl as oracle_grade_answer_verl
from tests.unit.rewards.test_math_grader import CASES

EXTRA = [
    ("\\boxed{5 liters}", "5"),
    ("\\boxed{ 5 }", "5"),
    ("\\fbox{5}", "5"),
    ("\\boxed {5}", "5"),
    ("The answer is 5", "5"),
    ("\\boxed{5}", "\\boxed{5}"),
    ("\\boxed{5}", "\\boxed{6}"),
    ("\\boxed{5}", ""),
    ("\\boxed{\\{1, 2\\}}", "\\{1,2\\}"),
    ("\\boxed{x \\in [2, 5)}", "[2,5)"),
    ("\\boxed{(x+1)(x-1)}", "x^2-1"),
    ("\\boxed{\\text{B}}", "B"),
    ("\\boxed{B}", "\\text{(B)}"),
]


def test_verdicts_equal_deepscalers_grader():
    disagreements = []
    for completion, gold in CASES + EXTRA:
        theirs = float(bool(oracle_grade_answer_verl(completion, gold)))
        ours = float(grade_answer_verl(completion, gold))
        if ours != theirs:
            disagreements.append((completion, gold, theirs, ours))
    assert not disagreements, disagreements


def test_eval_score_takes_the_first_of_a_list_ground_truth_and_never_raises():
    assert eval_score("so \\boxed{9.6}", ["9.6\n"]) == 1.0
    assert eval_score("\\boxed{142}", 142.0) == 1.0
    assert eval_score("\\boxed{1}", None) == 0.0
