"""The end-to-end half of tests/unit/rewards/test_math_grader.py (slow: the authors' Prime-RL grader, copied
test-only into tests/helpers/prime_math_oracle/, and ours on every case): the same verdicts."""

import pytest

from instella_recipes.rewards import math_reward
from tests.helpers.prime_math_oracle import compute_score as oracle_compute_score
from tests.helpers.prime_math_oracle import grader as oracle_grader
from tests.unit.rewards.test_math_grader import CASES


@pytest.fixture
def oracle_without_wall_clock_alarms(monkeypatch):
    """Their `math_equal` steps run under 1 s wall-clock alarms, which fire early on a loaded machine (the first
    sympy LaTeX parse alone loads antlr): for comparing the rules, the oracle's alarms are lifted to 60 s."""
    real = oracle_grader.time_limit
    monkeypatch.setattr(oracle_grader, "time_limit", lambda seconds: real(60.0))


@pytest.mark.usefixtures("oracle_without_wall_clock_alarms")
def test_verdicts_equal_the_authors_grader():
    disagreements = []
    for completion, gold in CASES:
        theirs = float(oracle_compute_score(completion, gold)[0])
        ours = math_reward(completion, gold)
        if ours != theirs:
            disagreements.append((completion, gold, theirs, ours))
    assert not disagreements, disagreements
