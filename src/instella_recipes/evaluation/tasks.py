"""Write the lm-eval task and group YAMLs under `eval/tasks/` from tables, so a suite and its offline twin (the same
task logic over shipped jsonl) cannot drift apart.

    python scripts/make_eval_tasks.py            # rewrite eval/tasks/ (run after upgrading lm-eval; commit the diff)
    python scripts/make_eval_tasks.py --check    # exit 1 if the shipped YAMLs differ from what this writes (CI)

Two kinds of suites:
- `instella_pretrain` / `instella_instruct`: the Instella tables measured as the authors measured them, with OLMES's
  settings (`olmes_settings.py`: one `eval/tasks/olmes/olmes_*.yaml` per OLMES task, and groups that average them as
  OLMES does). Their offline twins run the same settings over the shipped rows (the data source is all that differs).
- `amd_llama_135m`: lm-eval's own tasks (that model card was measured with lm-eval). Each offline task is a copy of
  the upstream YAML as lm-eval itself loads it (`TaskManager`'s index, includes merged), with `!function` references
  rewritten to the importable `lm_eval.tasks.<folder>.<module>.<fn>`. A test asserts that the logic keys equal
  upstream's.

Offline data: `dataset_path: json`, the shipped files in `dataset_kwargs.data_files`, loaded by
`custom_dataset: !function _data.load`, which finds them relative to the YAML rather than the current directory.
Why generated rather than `include:`d: lm-eval resolves `include:` relative to the including file, and the upstream
YAMLs live inside the installed package, whose path differs per machine.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import lm_eval
import yaml

from instella_recipes.core import exit_on_recipe_error, get_logger, parse_recipe, setup_logging
from instella_recipes.core.paths import EVAL_DIR, PUBLISHED_DIR, TASKS_DIR
from instella_recipes.data.tiny_world import TinyWorld
from instella_recipes.evaluation import olmes as olmes_task_code
from instella_recipes.evaluation import olmes_settings as olmes
from instella_recipes.evaluation.olmes_settings import FunctionRef, upstream_task_config

OFFLINE_DIR = TASKS_DIR / "offline"
OLMES_DIR = TASKS_DIR / "olmes"
UPSTREAM_DIR = Path(lm_eval.__file__).resolve().parent / "tasks"
DATA_KEYS = {
    "dataset_path", "dataset_name", "dataset_kwargs", "custom_dataset", "training_split", "validation_split",
    "test_split", "fewshot_split", "task", "tag", "group", "task_alias", "metadata",
}  # fmt: skip


@dataclass(frozen=True)
class Member:
    """One task of a suite: the upstream lm-eval task (or group), its few-shot count, and its offline stand-in."""

    name: str  # task or group name: lm-eval's own, or an OLMES one (eval/tasks/olmes)
    num_fewshot: int
    is_group: bool = False
    offline: str | None = None  # task whose logic the offline variant copies (a group's stand-in subtask)
    metric: str = "acc"  # the metric the report reads ("<metric>,<filter>")
    setting: str | None = None  # the OLMES task alias it reproduces; None: lm-eval's own task

    @property
    def offline_task(self) -> str:
        return f"{self.offline or self.name}_offline"


@dataclass(frozen=True)
class OfflineTask:
    """An offline task: upstream YAML (relative to lm_eval/tasks), shipped data per split, and the eval split."""

    upstream_yaml: str
    data: dict[str, str]
    overrides: dict = field(default_factory=dict)
    name: str | None = None  # defaults to "<upstream task>_offline"


# The suites. Published settings: SPEC.md 3 (Instella tables, measured with OLMES) and 4 (AMD-Llama-135m model card,
# measured with lm-eval). An OLMES group's offline stand-in is the subtask whose rows are shipped.
OLMES_STAND_INS = ("mmlu_high_school_geography:", "bbh_boolean_expressions:", "minerva_math_algebra:")


def _olmes_member(entry) -> Member:
    if isinstance(entry, olmes.Group):
        stand_in = next(m.name for m in entry.members if m.alias.startswith(OLMES_STAND_INS))
        return Member(entry.name, entry.members[0].num_fewshot, True, stand_in, f"{entry.metric},none", entry.alias)
    return Member(entry.name, entry.num_fewshot, metric=f"{entry.metric},none", setting=entry.alias)


SUITES: dict[str, list[Member]] = {
    "instella_pretrain": [_olmes_member(e) for e in olmes.PRETRAIN],
    "instella_instruct": [_olmes_member(e) for e in olmes.INSTRUCT],
    "amd_llama_135m": [
        Member("sciq", 0, metric="acc,none"),
        Member("winogrande", 0, metric="acc,none"),
        Member("piqa", 0, metric="acc,none"),
        Member("wsc273", 0, metric="acc,none"),
        Member("mmlu", 0, is_group=True, offline="mmlu_high_school_geography", metric="acc,none"),
        Member("lambada_openai", 0, metric="acc,none"),
        Member("arc_easy", 0, metric="acc,none"),
        Member("arc_challenge", 0, metric="acc,none"),
        Member("logiqa", 0, metric="acc,none"),
        Member("hellaswag", 0, metric="acc,none"),
    ],
}

# lm-eval's own groups the suites reference (name -> YAML under lm_eval/tasks), checked by the tests.
UPSTREAM_GROUPS = {"mmlu": "mmlu/default/_mmlu.yaml"}

_D = "../../data/offline/"
OFFLINE_TASKS: dict[str, OfflineTask] = {
    "arc_challenge": OfflineTask("arc/arc_challenge.yaml", {"test": _D + "arc_challenge.jsonl"}),
    "arc_easy": OfflineTask("arc/arc_easy.yaml", {"test": _D + "arc_easy.jsonl"}),
    "boolq": OfflineTask("super_glue/boolq/default.yaml", {"validation": _D + "boolq.jsonl"}),
    "hellaswag": OfflineTask("hellaswag/hellaswag.yaml", {"validation": _D + "hellaswag.jsonl"}),
    "piqa": OfflineTask("piqa/piqa.yaml", {"validation": _D + "piqa.jsonl"}),
    "sciq": OfflineTask("sciq/sciq.yaml", {"test": _D + "sciq.jsonl"}),
    "winogrande": OfflineTask("winogrande/default.yaml", {"validation": _D + "winogrande.jsonl"}),
    "openbookqa": OfflineTask("openbookqa/openbookqa.yaml", {"test": _D + "openbookqa.jsonl"}),
    "mmlu_high_school_geography": OfflineTask(
        "mmlu/default/mmlu_high_school_geography.yaml",
        {"test": _D + "mmlu_high_school_geography.jsonl", "dev": _D + "mmlu_high_school_geography.dev.jsonl"},
    ),
    "bbh_cot_fewshot_boolean_expressions": OfflineTask(
        "bbh/cot_fewshot/boolean_expressions.yaml", {"test": _D + "bbh_cot_fewshot_boolean_expressions.jsonl"}
    ),
    "gsm8k_cot": OfflineTask("gsm8k/gsm8k-cot.yaml", {"test": _D + "gsm8k_cot.jsonl"}),
    "truthfulqa_mc2": OfflineTask("truthfulqa/truthfulqa_mc2.yaml", {"validation": _D + "truthfulqa_mc2.jsonl"}),
    "gpqa_main_cot_zeroshot": OfflineTask(
        "gpqa/cot_zeroshot/gpqa_main_cot_zeroshot.yaml", {"train": _D + "gpqa_main_cot_zeroshot.jsonl"}
    ),
    "minerva_math_algebra": OfflineTask(
        "minerva_math/minerva_math_algebra.yaml", {"test": _D + "minerva_math_algebra.jsonl"}
    ),
    "ifeval": OfflineTask("ifeval/ifeval.yaml", {"train": _D + "ifeval.jsonl"}),
    "wsc273": OfflineTask("wsc273/default.yaml", {"test": _D + "wsc273.jsonl"}),
    "lambada_openai": OfflineTask("lambada/lambada_openai.yaml", {"test": _D + "lambada_openai.jsonl"}),
    "logiqa": OfflineTask("logiqa/logiqa.yaml", {"test": _D + "logiqa.jsonl"}),
}

# Shipped rows for the OLMES settings' offline twins (the same rows as the stock twins: each dataset's own schema).
OLMES_OFFLINE_DATA = {
    "arc_challenge": "arc_challenge", "arc_easy": "arc_easy", "boolq": "boolq", "hellaswag": "hellaswag",
    "piqa": "piqa", "sciq": "sciq", "winogrande": "winogrande", "openbookqa": "openbookqa",
    "mmlu_high_school_geography": "mmlu_high_school_geography", "bbh_boolean_expressions":
    "bbh_cot_fewshot_boolean_expressions", "gsm8k": "gsm8k_cot", "truthfulqa": "truthfulqa_mc2",
    "gpqa": "gpqa_main_cot_zeroshot", "minerva_math_algebra": "minerva_math_algebra", "ifeval": "ifeval",
}  # fmt: skip


def olmes_offline_settings() -> list:
    """The OLMES settings with an offline twin: every suite member, a group by its stand-in subtask."""
    members = [m for suite in ("instella_pretrain", "instella_instruct") for m in SUITES[suite]]
    names = {m.offline or m.name for m in members}
    return [s for s in olmes.all_settings() if s.name in names]


def olmes_offline_config(setting) -> dict:
    """An OLMES task over the shipped rows: only the data source differs from `olmes_settings.task_config`."""
    cfg = olmes.task_config(setting)
    key = next(k for k in OLMES_OFFLINE_DATA if setting.alias.startswith(k + ":"))
    files = {setting.split: f"{_D}{OLMES_OFFLINE_DATA[key]}.jsonl"}
    if setting.fewshot and setting.fewshot.get("split") == "dev":
        files["dev"] = f"{_D}{OLMES_OFFLINE_DATA[key]}.dev.jsonl"
        cfg["fewshot_split"] = "dev"
    cfg["task"] = f"{setting.name}_offline"
    cfg["dataset_path"] = "json"
    cfg["dataset_name"] = None
    cfg["dataset_kwargs"] = {"data_files": files}
    cfg["custom_dataset"] = FunctionRef("_data.load")
    return cfg


# The demo's suite over the TinyWorld eval items (instella_recipes/data/tiny_world.py, default seed): ARC logic for the
# multiple-choice facts; GSM8K's prompt ("Question: ...\nAnswer:", the format of the tiny corpus) with
# gsm8k-cot's "The answer is N." extraction (the format the tiny models are trained to answer in), 0-shot and at
# most 32 new tokens so it fits a 256-token context.
TINY_WORLD_TASKS: dict[str, OfflineTask] = {
    "tiny_world_mc": OfflineTask(
        "arc/arc_easy.yaml", {"test": "../../data/tiny_world/eval_mc.jsonl"}, name="tiny_world_mc"
    ),
    "tiny_world_arithmetic": OfflineTask(
        "gsm8k/gsm8k.yaml",
        {"test": "../../data/tiny_world/eval_arithmetic.jsonl"},
        name="tiny_world_arithmetic",
        overrides={
            "num_fewshot": 0,
            "generation_kwargs": {
                "until": ["Question:", "</s>", "<|im_end|>", "\n\n"],
                "do_sample": False,
                "temperature": 0.0,
                "max_gen_toks": 32,
            },
            "filter_list": [
                {
                    "name": "strict-match",
                    "filter": [
                        {"function": "regex", "regex_pattern": "The answer is (\\-?[0-9\\.\\,]+)"},
                        {"function": "take_first"},
                    ],
                },
                {
                    "name": "flexible-extract",
                    "filter": [
                        {"function": "regex", "group_select": -1, "regex_pattern": "(-?[$0-9.,]{2,})|(-?[0-9]+)"},
                        {"function": "take_first"},
                    ],
                },
            ],
        },
    ),
}
# The demo's evaluation (recipes/tiny/pipeline.yaml: `--tasks tiny_world,tiny_world_facts_chat`): the tiny_world
# group's two tasks and the chat-layout facts task beside it (eval/tasks/demo/), the one SFT teaches.
TINY_WORLD_METRICS = {
    "tiny_world_mc": "acc,none",
    "tiny_world_arithmetic": "exact_match,strict-match",
    "tiny_world_facts_chat": "acc,none",
}


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(FunctionRef, lambda dumper, value: dumper.represent_scalar("!function", str(value)))


def _upstream_function(path_string: str) -> FunctionRef:
    """`<lm_eval/tasks>/hellaswag/utils.process_docs` (as lm-eval's index leaves it unresolved) -> importable name."""
    relative = Path(path_string).relative_to(UPSTREAM_DIR).as_posix()
    return FunctionRef("lm_eval.tasks." + relative.replace("/", "."))


def _rewrite_functions(value):
    if isinstance(value, str) and value.startswith(str(UPSTREAM_DIR) + "/"):
        return _upstream_function(value)
    if isinstance(value, dict):
        return {k: _rewrite_functions(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rewrite_functions(v) for v in value]
    return value


def upstream_config(upstream_yaml: str) -> dict:
    """The upstream task config as lm-eval loads it (includes merged), functions as importable references."""
    return _rewrite_functions(upstream_task_config(UPSTREAM_DIR / upstream_yaml))


def offline_config(upstream_name: str, spec: OfflineTask) -> dict:
    """Upstream logic + shipped data: only the DATA_KEYS differ from upstream."""
    upstream = upstream_config(spec.upstream_yaml)
    cfg = {"task": spec.name or f"{upstream_name}_offline"}
    cfg["dataset_path"] = "json"
    cfg["dataset_kwargs"] = {"data_files": dict(spec.data)}
    cfg["custom_dataset"] = FunctionRef("_data.load")
    eval_split = next(s for s in spec.data if s not in ("dev",))
    upstream_eval = "test_split" if upstream.get("test_split") else "validation_split"
    cfg["training_split"] = None
    cfg["validation_split"] = eval_split if upstream_eval == "validation_split" else None
    cfg["test_split"] = eval_split if upstream_eval == "test_split" else None
    if upstream.get("fewshot_split"):
        cfg["fewshot_split"] = upstream["fewshot_split"] if upstream["fewshot_split"] in spec.data else None
    cfg.update({k: v for k, v in upstream.items() if k not in DATA_KEYS})
    cfg.update(spec.overrides)
    version = (upstream.get("metadata") or {}).get("version")
    cfg["metadata"] = {"version": version, "upstream_task": upstream["task"], "upstream_yaml": spec.upstream_yaml}
    return cfg


def suite_config(suite: str, offline: bool) -> dict:
    """The group YAML of one suite; each member of lm-eval's own tasks carries the suite's few-shot count (an OLMES
    task's is part of its setting)."""
    members = []
    for m in SUITES[suite]:
        ref = {"task": m.offline_task} if offline else {"group" if m.is_group else "task": m.name}
        members.append(ref if m.setting else {**ref, "num_fewshot": m.num_fewshot})
    cfg = {"group": f"{suite}_offline" if offline else suite, "task": members}
    if offline:  # every member a single task: lm-eval's unweighted mean over them is the suite score
        cfg["aggregate_metric_list"] = [
            {"metric": suite_metric(suite), "aggregation": "mean", "weight_by_size": False, "filter_list": "none"}
        ]
    cfg["metadata"] = {"version": 1.0, "suite_score": suite_score_rule(suite, offline)}
    return cfg


def suite_metric(suite: str) -> str:
    """The metric every member of the suite reports: their common one (amd_llama_135m: `acc`), else `primary_score`
    (each OLMES task's primary metric under one name: eval/tasks/olmes/olmes.py)."""
    names = {m.metric.split(",")[0] for m in SUITES[suite]}
    return names.pop() if len(names) == 1 else olmes_task_code.PRIMARY_SCORE


# Why a suite group has no `aggregate_metric_list`: lm-eval 0.4.13's `Group.aggregate` (lm_eval/api/group.py) averages
# a group's metric over its LEAF tasks (`get_all_tasks()`, recursive), never over its sub-groups' aggregates, and
# weights each leaf equally or by its doc count. The published Avg is the mean of the columns, three of which
# (MMLU, BBH, MATH) are themselves averages over 57, 27 and 7 leaf tasks: no leaf weighting lm-eval offers gives it
# (the leaf mean would count MMLU 57 times). So each column is lm-eval's (a task's metric, or a sub-suite group's
# aggregate) and the suite score is their mean, written down here for any reader of the YAML and computed by the
# report (`report.build_rows`). The offline twins' members are single tasks (a sub-suite's stand-in subtask), so
# there lm-eval's unweighted group mean of `primary_score` is the rule, and their group YAMLs carry it.
SUITE_SCORE_RULE = (
    "unweighted mean over the columns of each column's score (a member task's primary metric, or a sub-suite group's "
    "aggregate), as the published table's Avg; computed by scripts/eval_report.py (lm-eval's group aggregation "
    "averages leaf tasks, not sub-groups)"
)
OFFLINE_SUITE_SCORE_RULE = (
    "unweighted mean over the columns of each column's score, as the published table's Avg; every member here is a "
    "single task, so this group's aggregate (aggregate_metric_list) is it"
)


def suite_score_rule(suite: str, offline: bool) -> dict:
    """The suite score's rule and its columns (published label -> `<task or group> <metric key>`), recorded in the
    suite's group YAML. A judged column (no lm-eval task) is named as such."""
    published = yaml.safe_load((PUBLISHED_DIR / f"{suite}.yaml").read_text())
    columns = {}
    for label, member in published["columns"].items():
        if member is None:
            columns[label] = "judge score, not an lm-eval task (scripts/eval_report.py --judge)"
            continue
        m = next(m for m in SUITES[suite] if m.name == member)
        columns[label] = f"{m.offline_task if offline else m.name} {m.metric}"
    return {"rule": OFFLINE_SUITE_SCORE_RULE if offline else SUITE_SCORE_RULE, "columns": columns}


def tiny_world_suite() -> dict:
    return {"group": "tiny_world", "task": list(TINY_WORLD_TASKS), "metadata": {"version": 1.0}}


HEADER = (
    "# Generated by scripts/make_eval_tasks.py from lm-eval {version}'s own task YAMLs; "
    "edit the generator, not this.\n"
)


def render(cfg: dict) -> str:
    body = yaml.dump(cfg, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000)
    return HEADER.format(version=lm_eval.__version__ if hasattr(lm_eval, "__version__") else "?") + body


def generated_files() -> dict[Path, str]:
    """Every file this module owns (task YAMLs and the TinyWorld eval jsonl), path -> text."""
    files = {}
    for setting in olmes.all_settings():
        files[OLMES_DIR / f"{setting.name}.yaml"] = render(olmes.task_config(setting))
    for entry in olmes.PRETRAIN + olmes.INSTRUCT:
        if isinstance(entry, olmes.Group):
            files[OLMES_DIR / f"{entry.name}.yaml"] = render(olmes.group_config(entry))
    for setting in olmes_offline_settings():
        files[OFFLINE_DIR / f"{setting.name}_offline.yaml"] = render(olmes_offline_config(setting))
    for suite in SUITES:
        files[TASKS_DIR / f"{suite}.yaml"] = render(suite_config(suite, offline=False))
        files[OFFLINE_DIR / f"{suite}_offline.yaml"] = render(suite_config(suite, offline=True))
    for name, spec in OFFLINE_TASKS.items():
        files[OFFLINE_DIR / f"{name}_offline.yaml"] = render(offline_config(name, spec))
    for name, spec in TINY_WORLD_TASKS.items():
        files[OFFLINE_DIR / f"{name}.yaml"] = render(offline_config(name, spec))
    files[OFFLINE_DIR / "tiny_world.yaml"] = render(tiny_world_suite())
    world = TinyWorld()  # the default seed: the world the demo trains on
    for name, rows in (("eval_mc", world.eval_multiple_choice()), ("eval_arithmetic", world.eval_arithmetic())):
        files[EVAL_DIR / "data" / "tiny_world" / f"{name}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows)
    return files


def stale_files() -> list[Path]:
    """Generated files that are missing or differ from what is shipped."""
    return [p for p, text in generated_files().items() if not p.is_file() or p.read_text() != text]


# --- the command (scripts/make_eval_tasks.py) -----------------------------------------------------------------------
logger = get_logger(__name__)


@dataclass
class MakeEvalTasksArguments:
    """The settings of `scripts/make_eval_tasks.py`."""

    check: bool = field(default=False, metadata={"help": "Only report YAMLs that differ; exit 1 if any."})


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/make_eval_tasks.py`: rewrite eval/tasks/, or (`--check`) exit 1 if a shipped file differs."""
    (args,) = parse_recipe([MakeEvalTasksArguments], argv)
    setup_logging()
    if args.check:
        stale = stale_files()
        for path in stale:
            logger.error(f"stale: {path} (run python scripts/make_eval_tasks.py)")
        return 1 if stale else 0
    files = generated_files()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    logger.info(f"wrote {len(files)} YAMLs under {TASKS_DIR}")
    return 0
