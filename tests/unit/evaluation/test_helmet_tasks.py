"""The HELMET tasks of eval/tasks/helmet/ (Instella-Long's Table 3): they load with lm-eval alone, build HELMET's very
prompts and sample selection, and score like HELMET; the oracle is HELMET's own code (tests/helpers/helmet_oracle.py,
copied from princeton-nlp/HELMET 4526dfb, test-only)."""

import ast
import importlib.util
import random
from pathlib import Path

import pytest
import yaml
from lm_eval.tasks import TaskManager, get_task_dict

from tests.helpers import helmet_oracle as oracle

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "eval" / "tasks" / "helmet"
STANDINS = ROOT / "eval" / "data" / "offline" / "helmet"
LENGTHS = ("8k", "16k", "32k", "64k", "128k")


@pytest.fixture(scope="module")
def utils():
    spec = importlib.util.spec_from_file_location("helmet_utils", TASKS / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BUILT = ["helmet_rag_nq_8k", "helmet_rag_triviaqa_8k", "helmet_rag_hotpotqa_8k", "helmet_niah_mv_32k"]
BUILT += ["helmet_infbench_mc_128k", "helmet_infbench_qa_128k", "helmet_narrativeqa_128k"]


@pytest.fixture(scope="module")
def manager():
    return TaskManager(include_path=str(TASKS), include_defaults=False)


@pytest.fixture(scope="module")
def tasks(manager):
    """Some tasks built by lm-eval from the YAMLs (each length's file differs only in its metadata)."""
    return get_task_dict(BUILT, manager)


def test_utils_imports_only_what_lm_eval_has():
    """The tasks must load with lm-eval alone: utils.py imports no project module."""
    tree = ast.parse((TASKS / "utils.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"hashlib", "json", "os", "random", "re", "string", "collections", "pathlib", "datasets"}


def test_group_has_the_seven_published_columns(manager, tasks):
    columns = ["rag_nq", "rag_triviaqa", "rag_hotpotqa", "niah_mv"]
    expected = {f"helmet_{kind}_{n}" for kind in columns for n in LENGTHS}
    expected |= {"helmet_infbench_qa_128k", "helmet_infbench_mc_128k", "helmet_narrativeqa_128k"}
    assert expected <= set(manager.all_subtasks)
    top = yaml.safe_load((TASKS / "helmet_instella_long.yaml").read_text())
    assert top["task"] == [
        "helmet_rag_nq", "helmet_rag_triviaqa", "helmet_rag_hotpotqa", "helmet_infbench_qa_128k",
        "helmet_infbench_mc_128k", "helmet_narrativeqa_128k", "helmet_niah_mv",
    ]  # fmt: skip
    assert set(manager.all_groups) >= {f"helmet_{c}" for c in columns} | {"helmet_instella_long"}
    assert all(len(list(task.test_docs())) > 0 for task in tasks.values())
    group = yaml.safe_load((TASKS / "helmet_niah_mv.yaml").read_text().split("\n", 1)[1])
    assert group["aggregate_metric_list"] == [
        {"metric": "ruler_recall", "aggregation": "mean", "weight_by_size": False}
    ]
    rag = yaml.safe_load((TASKS / "helmet_rag_nq_64k.yaml").read_text().split("\n", 1)[1])
    assert rag["metadata"]["test_file"] == "kilt/nq-dev-multikilt_1000_k440_dep6.jsonl"  # HELMET rag_short.yaml
    config = tasks["helmet_rag_nq_8k"].config
    assert config.generation_kwargs["max_gen_toks"] == 20 and config.generation_kwargs["until"] == ["\n"]


@pytest.mark.parametrize("dataset", ["nq", "triviaqa", "hotpotqa"])
def test_rag_prompts_are_helmets(tasks, dataset):
    """Same questions, same 2 demos (per-question sha256 seed), same prompt text as HELMET's load_qa."""
    random.seed(42)  # HELMET eval.py seeds random before load_qa samples the questions
    data = oracle.load_qa(
        f"kilt_{dataset}", str(STANDINS / f"kilt_{dataset}.jsonl"), str(STANDINS / f"kilt_{dataset}_demos.jsonl"),
        max_test_samples=100, shots=2,
    )  # fmt: skip
    theirs = [data["prompt_template"].format(**item) for item in data["data"]]
    task = tasks[f"helmet_rag_{dataset}_8k"]
    ours = [task.doc_to_text(doc) for doc in task.test_docs()]
    assert ours == theirs and ours[0].count("\nQuestion: ") == 3  # two demos, then the question


def test_niah_prompts_and_recall_are_helmets(tasks, utils):
    data = oracle.load_ruler("ruler_niah_mv", str(STANDINS / "niah_mv.jsonl"), max_test_samples=100, seed=42)
    task = tasks["helmet_niah_mv_32k"]
    docs = list(task.test_docs())
    assert [task.doc_to_text(d) for d in docs] == [data["prompt_template"].format(**item) for item in data["data"]]
    for doc, item in zip(docs, data["data"]):
        for generated in (f" {item['answer'][0]} and {item['answer'][1]}.", f" {item['answer'][1]} only", " none"):
            prefix = data["system_template"].format(**item)  # HELMET prepends it without a chat template
            theirs, _ = data["post_process"]({"output": prefix + generated}, item)
            assert utils.process_recall(doc, [generated]) == theirs
    assert utils.process_recall(docs[0], [f" {docs[0]['answer'][0]}"]) == {"ruler_recall": 0.5}


@pytest.mark.parametrize(
    "output, answers",
    [
        ("Answer: Mercury.", ["Mercury"]),
        ("The answer is the Mira Sol novel", ["Mira Sol", "Sol"]),
        ("yes", ["no"]),
        ("\nI think it is Pell\nmore text", ["pell"]),
        ("Answer: answer: stone bridge", ["a stone"]),
    ],
)
def test_metrics_are_helmets(utils, output, answers):
    theirs, _ = oracle.default_post_process({"output": output}, {"answer": answers})
    assert utils._scored(output, answers) == pytest.approx({k: float(v) for k, v in theirs.items()})
    assert utils.parse_output(output) == oracle.parse_output(output)


def test_choice_and_judged_scoring(tasks, utils):
    mc = tasks["helmet_infbench_mc_128k"]
    doc = next(d for d in mc.test_docs() if d["prompt"].rsplit("Question: ", 1)[1].startswith("What colour"))
    assert doc["answer"] == ["B", "B. red"] and "Options:\nA. blue\nB. red" in doc["prompt"]
    assert mc.doc_to_text(doc).startswith("You are given a story and a question with multiple choices")
    assert utils.process_choice(doc, ["B"]) == {"exact_match": 1.0}
    assert utils.process_choice(doc, ["I pick B. red"]) == {"exact_match": 1.0}
    assert utils.process_choice(doc, ["A"]) == {"exact_match": 0.0}
    qa = tasks["helmet_infbench_qa_128k"]
    doc = next(d for d in qa.test_docs() if d["prompt"].rsplit("Question: ", 1)[1].startswith("What was the sailor"))
    assert "For example:\n\n[story text]\nQuestion:" in doc["prompt"]  # 2 shots from the other items
    assert utils.process_judged(doc, ["Idris"])["substring_exact_match"] == 1.0


def test_missing_data_dir_is_one_clear_error(utils, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^error: HELMET data file .*niah_multivalue/validation_8192.jsonl"):
        utils.load("niah_mv", "ruler/niah_multivalue/validation_8192.jsonl", "niah_mv.jsonl", data_dir=str(tmp_path))


def test_published_table_is_consistent_and_names_our_tasks(manager):
    """eval/expected/instella_long_helmet.yaml: every Avg is the mean of its columns (Table 3 to 2 decimals, Table 4
    to 2 decimals over its 12 cells), and every column names a task or group that exists."""
    table = yaml.safe_load((ROOT / "eval" / "expected" / "instella_long_helmet.yaml").read_text())
    known = set(manager.all_subtasks) | set(manager.all_groups)
    for column in table["columns"].values():
        assert column is None or column[0] in known
    for name, row in table["models"].items():
        values = [row[c] for c in table["columns"]]
        assert sum(values) / len(values) == pytest.approx(row["Avg"], abs=0.006), name
    per_length = table["per_length"]
    assert all(t in known for tasks in per_length["columns"].values() for t in tasks)
    for name, row in per_length["models"].items():
        cells = [v for c in per_length["columns"] for v in row[c]]
        assert sum(cells) / len(cells) == pytest.approx(row["Avg"], abs=0.006), name
