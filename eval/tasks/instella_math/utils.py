"""lm-eval hooks of the Instella-Math tasks (the authors' DeepScaleR protocol, AMD-AIG-AIMA/Instella-Math 65534d3
`evals/verl_amd/verl/trainer/main_generation.py`): the prompt is the row's user message (it already ends with
"Let's think step by step and output the final answer within \\boxed{}."), the 16 samples of a problem are scored
one by one with DeepScaleR's `grade_answer_verl` (last `\\boxed{}`, mathd string or sympy), and a problem reports
pass@1 = the mean of its 16 scores (so the task's mean is the mean over all samples, as theirs) and pass@16 = 1 if
any sample is right.

This file loads with lm-eval alone: the grader is imported inside `process_results` only. Where the project is not
installed (a separate vLLM venv) it is imported from this clone's `src/`; it needs sympy, pylatexenc and
antlr4-python3-runtime 4.11 in that Python.
"""

import sys
from pathlib import Path

import datasets

REPO_SRC = Path(__file__).resolve().parents[3] / "src"


def _eval_score():
    """The project's evaluation grader: installed, else from this clone's `src/`."""
    try:
        # the project's grader (instella_recipes.rewards): imported here so that the task loads without the package
        from instella_recipes.rewards.deepscaler_grader import eval_score
    except ModuleNotFoundError as err:
        if err.name != "instella_recipes" or not REPO_SRC.is_dir():
            raise
        sys.path.insert(0, str(REPO_SRC))
        from instella_recipes.rewards.deepscaler_grader import eval_score
    return eval_score


def load(data_files: dict, config_source: str | None = None, **_metadata) -> datasets.DatasetDict:
    """`custom_dataset` hook of the offline stand-ins: jsonl files relative to the task YAML's folder."""
    base = Path(config_source).resolve().parent if config_source else Path(__file__).resolve().parent
    files = {split: str(base / name) for split, name in data_files.items()}
    return datasets.load_dataset("json", data_files=files)


def doc_to_text(doc: dict) -> str:
    """The user message of the row's `prompt` (one chat turn; run with `--apply_chat_template`)."""
    return doc["prompt"][0]["content"]


def ground_truth(doc: dict) -> str:
    """`reward_model.ground_truth` as their scorer reads it: the first element of a list (Minerva, OlympiadBench),
    `str()` of anything else (AMC's answers are floats: "142.0")."""
    truth = doc["reward_model"]["ground_truth"]
    return str(truth[0] if isinstance(truth, list | tuple) else truth)


def process_results(doc: dict, results: list) -> dict:
    """pass@1 (mean over this problem's samples) and pass@16 (any sample right) from the `take_first_k` samples."""
    eval_score = _eval_score()
    samples = results[0] if results and isinstance(results[0], list) else results
    truth = ground_truth(doc)
    scores = [eval_score(sample, truth) for sample in samples]
    return {"pass@1": sum(scores) / len(scores), f"pass@{len(scores)}": float(max(scores))}
