"""The lm-eval suites: generated files up to date, offline tasks = upstream logic + shipped data, the real `lm_eval`
CLI on a tiny trust_remote_code checkpoint from another cwd, metric wiring proven with an oracle LM, the report, and
the checks before model work."""

import json
import re
from pathlib import Path

import pytest
import yaml
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

from instella_recipes.core import RecipeError
from instella_recipes.evaluation import preflight as run
from instella_recipes.evaluation import report
from instella_recipes.evaluation import tasks as make_tasks
from instella_recipes.evaluation.olmes_settings import upstream_task_config

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "eval" / "tasks"
OFFLINE = TASKS / "offline"


def test_shipped_yamls_and_tiny_world_items_equal_what_the_generator_writes():
    assert make_tasks.stale_files() == []
    from instella_recipes.data.tiny_world import TinyWorld

    shipped = [json.loads(line) for line in (ROOT / "eval/data/tiny_world/eval_mc.jsonl").read_text().splitlines()]
    assert shipped == TinyWorld().eval_multiple_choice()


def _logic(cfg: dict) -> dict:
    """Task config without its data source; `!function` references as importable names (left unresolved, so tasks
    whose helpers need optional packages, IFEval and Minerva MATH, are compared too)."""

    def norm(value):
        if isinstance(value, str) and value.startswith(str(make_tasks.UPSTREAM_DIR) + "/"):
            return str(make_tasks._upstream_function(value))
        if isinstance(value, str) and value.startswith(str(OFFLINE) + "/"):
            return value[len(str(OFFLINE)) + 1 :]
        if isinstance(value, dict):
            return {k: norm(v) for k, v in value.items()}
        if isinstance(value, list):
            return [norm(v) for v in value]
        return value

    return {k: norm(v) for k, v in cfg.items() if k not in make_tasks.DATA_KEYS}


@pytest.mark.parametrize("name", sorted(make_tasks.OFFLINE_TASKS))
def test_offline_task_is_the_upstream_task_with_only_the_data_source_changed(name):
    spec = make_tasks.OFFLINE_TASKS[name]
    ours = upstream_task_config(OFFLINE / f"{name}_offline.yaml")
    upstream = upstream_task_config(make_tasks.UPSTREAM_DIR / spec.upstream_yaml)
    assert _logic(ours) == _logic(upstream)
    assert ours["dataset_path"] == "json" and ours["custom_dataset"] == str(OFFLINE / "_data.load")
    for path in ours["dataset_kwargs"]["data_files"].values():
        assert (OFFLINE / path).resolve().is_file()


def test_suites_use_the_published_settings():
    """amd_llama_135m: lm-eval's own tasks (its card was measured with lm-eval); the Instella suites: the OLMES
    settings the authors ran (eval/tasks/olmes), offline twins differing only in the data."""
    upstream_names = {}
    for spec in make_tasks.OFFLINE_TASKS.values():
        upstream_names[upstream_task_config(make_tasks.UPSTREAM_DIR / spec.upstream_yaml)["task"]] = spec
    for group, path in make_tasks.UPSTREAM_GROUPS.items():
        assert upstream_task_config(make_tasks.UPSTREAM_DIR / path)["group"] == group
    olmes_names = {p.stem for p in (TASKS / "olmes").glob("*.yaml")}
    for suite, members in make_tasks.SUITES.items():
        cfg = yaml.safe_load((TASKS / f"{suite}.yaml").read_text())
        offline = yaml.safe_load((OFFLINE / f"{suite}_offline.yaml").read_text())
        assert len(cfg["task"]) == len(offline["task"]) == len(members)
        for member, entry, off in zip(members, cfg["task"], offline["task"]):
            ref = entry.get("group") or entry["task"]
            if suite == "amd_llama_135m":
                assert member.setting is None and entry["num_fewshot"] == off["num_fewshot"] == member.num_fewshot
                assert ref in (make_tasks.UPSTREAM_GROUPS if member.is_group else upstream_names)
            else:
                assert member.setting and ref in olmes_names and (OFFLINE / f"{off['task']}.yaml").is_file()
    shots = {m.setting: m.num_fewshot for m in make_tasks.SUITES["instella_pretrain"]}
    assert shots["mmlu:mc::olmes"] == 5 and shots["bbh:cot-v1::olmes"] == 3 and shots["gsm8k::olmes"] == 8
    assert sum(shots.values()) == 16  # everything else zero-shot (SPEC.md 3)
    assert {m.setting: m.num_fewshot for m in make_tasks.SUITES["instella_instruct"]}["gpqa:0shot_cot::llama3.1"] == 0


# --- metric wiring -----------------------------------------------------------------------------------------------
class Oracle(LM):
    """Knows every answer of the shipped items; `right=False` always prefers a wrong one."""

    def __init__(self, right: bool):
        super().__init__()
        self.right = right
        self.answers = {}
        for file in ("eval/data/tiny_world/eval_mc.jsonl", "eval/data/offline/arc_easy.jsonl"):
            for row in map(json.loads, (ROOT / file).read_text().splitlines()):
                self.answers[row["question"]] = row["choices"]["text"][row["choices"]["label"].index(row["answerKey"])]
        for row in map(json.loads, (ROOT / "eval/data/tiny_world/eval_arithmetic.jsonl").read_text().splitlines()):
            self.answers[row["question"]] = int(row["answer"].split("####")[-1])

    def _answer(self, context: str):
        return self.answers[re.findall(r"Question: (.*)\nAnswer:", context)[-1]]

    def loglikelihood(self, requests, disable_tqdm=False):
        out = []
        for request in requests:
            context, continuation = request.args
            correct = continuation.strip() == self._answer(context)
            out.append((0.0 if correct == self.right else -10.0, True))
        return out

    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for request in requests:
            n = self._answer(request.args[0]) + (0 if self.right else 1)
            out.append(f" {n}. The answer is {n}.")
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


@pytest.mark.parametrize("right", [True, False])
def test_a_model_that_knows_the_answers_scores_one_and_a_wrong_one_zero(right):
    from lm_eval import simple_evaluate

    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    out = simple_evaluate(model=Oracle(right), tasks=["tiny_world", "arc_easy_offline"], task_manager=manager)
    results = out["results"]
    expected = 1.0 if right else 0.0
    assert results["tiny_world_mc"]["acc,none"] == expected
    assert results["tiny_world_mc"]["acc_norm,none"] == expected
    assert results["arc_easy_offline"]["acc,none"] == expected
    assert results["tiny_world_arithmetic"]["exact_match,strict-match"] == expected
    assert out["n-samples"]["tiny_world_mc"]["effective"] == 24  # every shipped item scored


# --- the report's averages ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("suite", ["instella_pretrain", "instella_instruct"])
def test_report_reproduces_the_published_averages(suite):
    published, rows = report.build_rows(suite, [])
    for row in rows:
        assert row["avg"] == pytest.approx(row["published_avg"], abs=0.01), row["name"]  # MT-Bench on 0-10 included


def test_report_rejects_bad_input(tmp_path):
    with pytest.raises(RecipeError, match="unknown suite"):
        report.load_published("nope")
    with pytest.raises(RecipeError, match="no lm-eval result file"):
        report.find_result_file(tmp_path)
    (tmp_path / "results_x.json").write_text("{}")
    with pytest.raises(RecipeError, match="not an lm-eval result file"):
        report.build_rows("tiny_world", [tmp_path / "results_x.json"])


# --- checks before model work --------------------------------------------------------------------------------------
def test_preflight_errors_before_any_model_work(tiny_model_dir, tmp_path):
    with pytest.raises(RecipeError, match="model_dir .* does not exist"):
        run.preflight(tmp_path / "missing", ["tiny_world"])
    (tmp_path / "not_a_model").mkdir()
    with pytest.raises(RecipeError, match="no config.json"):
        run.preflight(tmp_path / "not_a_model", ["tiny_world"])
    # the tiny checkpoint has a 256-token context: MMLU's 5-shot prompt does not fit
    too_long = r"olmes_mmlu_high_school_geography_mc__olmes_offline: a 5-shot prompt .* context is 256"
    with pytest.raises(RecipeError, match=too_long):
        run.preflight(tiny_model_dir, ["instella_pretrain_offline"], limit=1)
    assert run.preflight(tiny_model_dir, ["tiny_world"], limit=2) == 2 + 2 * 4  # 2 generations, 2 x 4 choices
    with pytest.raises(RecipeError, match="chat-formatted: the model's tokenizer has no chat template"):
        run.preflight(tiny_model_dir, ["instella_instruct_offline"], limit=1)
    with pytest.raises(RecipeError, match="run the chat-formatted instruct suites on their own"):
        run.preflight(tiny_model_dir, ["instella_instruct_offline", "tiny_world"], limit=1)
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--model_dir", str(tmp_path / "missing"), "--tasks", "tiny_world", "--check_only"])
    assert exit_info.value.code == 2
    with pytest.raises(RecipeError, match="unknown task or group 'no_such_suite'"):
        run.preflight(tiny_model_dir, ["tiny_world", "no_such_suite"])
    # online suites and lm-eval's own tasks are known by name; their data is not built here (it would download)
    assert run.preflight(tiny_model_dir, ["instella_pretrain", "arc_easy"]) == 0


def test_run_builds_the_lm_eval_command():
    args = run.EvaluateArguments(
        model_dir="m", tasks="instella_instruct_offline", num_fewshot=None, limit=3, output_path="o"
    )
    cmd = run.lm_eval_command(args, ["--batch_size", "auto"])
    assert cmd[-2:] == ["--batch_size", "auto"] and "--apply_chat_template" in cmd
    assert cmd[cmd.index("--model_args") + 1] == "pretrained=m,trust_remote_code=True"
    assert cmd[cmd.index("--include_path") + 1] == str(run.TASKS_DIR) and cmd[cmd.index("--limit") + 1] == "3"
    args.task_list = ["instella_pretrain"]
    assert "--apply_chat_template" not in run.lm_eval_command(args, [])


def test_tiny_world_report_has_the_demo_tasks_and_claims_no_published_numbers(tmp_path):
    """`eval_report --suite tiny_world` on a demo result: the chat-layout facts task is a column too, and the chart
    does not promise a published comparison that does not exist."""
    results = {
        "tiny_world_mc": {"acc,none": 0.5, "acc_stderr,none": 0.1},
        "tiny_world_arithmetic": {"exact_match,strict-match": 0.1, "exact_match_stderr,strict-match": 0.05},
        "tiny_world_facts_chat": {"acc,none": 0.875, "acc_stderr,none": 0.07},
    }
    (tmp_path / "results_2026-01-01T00-00-00.json").write_text(json.dumps({"results": results}))
    published, rows = report.build_rows("tiny_world", [tmp_path], names=["sft"])
    assert rows[0]["scores"] == {"tiny_world_mc": 50.0, "tiny_world_arithmetic": 10.0, "tiny_world_facts_chat": 87.5}
    assert "vs published" not in report.chart_title(published, rows)
    assert "vs published" in report.chart_title(*report.build_rows("amd_llama_135m", [tmp_path]))
    table, _ = report.write_report("tiny_world", [tmp_path], tmp_path / "out", names=["sft"])
    assert "tiny_world_facts_chat" in table.read_text()


def test_judge_scores_are_label_number_pairs():
    assert report.parse_judge(["AE2=17.1", "MT-B=7.0"]) == {"AE2": 17.1, "MT-B": 7.0}
    for bad in ("=5", "AE2", "AE2=high"):
        with pytest.raises(RecipeError, match="--judge expects LABEL=NUMBER"):
            report.parse_judge([bad])
