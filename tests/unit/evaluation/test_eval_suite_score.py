"""The suite score (the published tables' Avg) from lm-eval's own group aggregation, on fixed per-task results.

The group tree of each suite is built from our shipped YAMLs as lm-eval indexes them (`TaskManager` over eval/tasks,
`Group.from_config`), with stand-in leaf tasks that carry fixed results, and lm-eval's own `aggregate_groups`
computes every group: the sub-suites (MMLU, BBH, MATH) as OLMES averages them, the suite score as the report reads
it = the unweighted mean of the columns' primary metrics. A test pins why the suite group itself has no
`aggregate_metric_list`: lm-eval averages a group over its leaf tasks, which is not the published rule; the offline
twins (single tasks only) have one, and it equals the suite score.
"""

import random

import pytest
from lm_eval.api.group import Group
from lm_eval.api.task import ConfigurableTask
from lm_eval.config.group import AggMetricConfig
from lm_eval.evaluator_utils import EvalAcc, aggregate_groups
from lm_eval.tasks import TaskManager

from instella_recipes.evaluation import olmes_settings as olmes
from instella_recipes.evaluation import report
from instella_recipes.evaluation import tasks as make_tasks


class Leaf(ConfigurableTask):
    """A task of the tree that is never built (no dataset): lm-eval's aggregation needs only its name."""

    def __init__(self, name: str):  # noqa: D107 - ConfigurableTask.__init__ would load the dataset
        self._name = name

    @property
    def task_name(self) -> str:
        return self._name


@pytest.fixture(scope="module")
def index():
    return TaskManager(include_path=str(make_tasks.TASKS_DIR), include_defaults=False).task_index


def build(index, name: str, groups: dict[str, Group]) -> Group | Leaf:
    """The lm-eval Group (children added, as lm-eval's factory adds them) or leaf task named `name`."""
    entry = index[name]
    if "group" not in entry.cfg:
        return Leaf(name)
    group = Group.from_config(entry.cfg)
    for child in entry.cfg["task"]:
        child_name = child if isinstance(child, str) else child.get("group") or child.get("task")
        group.add(build(index, child_name, groups))
    groups[name] = group
    return group


def settings_by_name() -> dict[str, olmes.Setting]:
    return {s.name: s for s in olmes.all_settings()}


def fixed_results(leaves: list[str]) -> dict[str, dict]:
    """Per leaf task: its primary metric (the one the report reads) at a fixed value, the same as `primary_score`
    (every OLMES task reports both), a stderr, and its doc count (the split size where OLMES's setting records it,
    else a fixed one)."""
    rng = random.Random(0)
    settings = settings_by_name()
    out = {}
    for name in leaves:
        setting = settings[name]
        n = setting.n_eval or rng.randint(100, 1500)
        value = round(rng.random(), 4)
        out[name] = {"sample_len": n, f"{setting.metric},none": value, f"{setting.metric}_stderr,none": 0.01,
                     "primary_score,none": value}  # fmt: skip
    return out


def by_hand(column: olmes.Setting | olmes.Group, results: dict[str, dict]) -> float:
    """A column's score as OLMES defines it: a task's primary metric; a suite's macro or micro average of it."""
    if isinstance(column, olmes.Setting):
        return results[column.name][f"{column.metric},none"]
    values = [results[m.name][f"{column.metric},none"] for m in column.members]
    if column.average == "macro":
        return sum(values) / len(values)
    sizes = [results[m.name]["sample_len"] for m in column.members]
    return sum(v * n for v, n in zip(values, sizes)) / sum(sizes)


@pytest.mark.parametrize(
    ("suite", "columns"), [("instella_pretrain", olmes.PRETRAIN), ("instella_instruct", olmes.INSTRUCT)]
)
def test_suite_score_is_the_mean_of_the_columns_primary_metrics(index, suite, columns):
    groups: dict[str, Group] = {}
    root = build(index, suite, groups)
    leaves = [t.task_name for t in root.get_all_tasks()]
    assert len(leaves) == sum(len(c.members) if isinstance(c, olmes.Group) else 1 for c in columns)
    results = EvalAcc(metrics=fixed_results(leaves), groups=groups)
    metrics = aggregate_groups(results).metrics  # lm-eval's own code: every group, bottom-up
    for column in columns:  # each sub-suite's aggregate is OLMES's macro / micro average, of both names
        if isinstance(column, olmes.Group):
            assert metrics[column.name][f"{column.metric},none"] == pytest.approx(by_hand(column, metrics))
            assert metrics[column.name]["primary_score,none"] == pytest.approx(by_hand(column, metrics))
    published = report.load_published(suite)
    scores, offline = report.scores_from_results(metrics, suite, published)
    score, n = report.average(scores, list(published["columns"]))
    expected = [100 * by_hand(c, metrics) for c in columns]
    assert not offline and n == len(columns)  # instruct: AE2 and MT-B come from --judge, not lm-eval
    assert score == pytest.approx(sum(expected) / len(expected))


def test_suite_yaml_records_the_columns_the_report_reads(index):
    for suite in make_tasks.SUITES:
        recorded = index[suite].cfg["metadata"]["suite_score"]["columns"]
        published = report.load_published(suite)
        assert list(recorded) == list(published["columns"])
        for label, member in published["columns"].items():
            if member is not None:
                metric, names = report._member_keys(suite, member)
                assert recorded[label] == f"{names[0]} {metric}"


def test_lm_eval_group_aggregation_averages_leaf_tasks_not_columns(index):
    """Why the suite group carries its rule in metadata and not an `aggregate_metric_list`: given one (of
    `primary_score`, which every task reports), lm-eval's aggregate is the mean over the 93 leaf tasks, which weights
    MMLU's 57 subjects 57 times, not the mean over the 11 columns."""
    groups: dict[str, Group] = {}
    root = build(index, "instella_pretrain", groups)
    leaves = [t.task_name for t in root.get_all_tasks()]
    results = fixed_results(leaves)
    root.aggregate_metric_list = [AggMetricConfig(metric="primary_score", filter_list="none", weight_by_size=False)]
    metrics = aggregate_groups(EvalAcc(metrics=results, groups=groups)).metrics
    leaf_mean = sum(results[n]["primary_score,none"] for n in leaves) / len(leaves)
    columns = [by_hand(c, metrics) for c in olmes.PRETRAIN]
    assert metrics["instella_pretrain"]["primary_score,none"] == pytest.approx(leaf_mean)
    assert abs(leaf_mean - sum(columns) / len(columns)) > 1e-3


def test_evaluate_names_the_report_command_for_each_suite():
    """`evaluate.py` hands over to `lm_eval` (its table has every column, not their mean): it logs the report
    command that prints the suite score, for the suites with a published table only."""
    from instella_recipes.evaluation.preflight import suite_score_hints

    hints = suite_score_hints(["instella_pretrain_offline", "tiny_world", "olmes_gsm8k__olmes"], "runs/eval/s1")
    assert hints == [
        "suite score of instella_pretrain_offline (the published Avg: mean of its columns) after the run: "
        "python scripts/eval_report.py --suite instella_pretrain --results runs/eval/s1 --output_dir <folder>"
    ]
    assert "--output_path" in suite_score_hints(["instella_instruct"], None)[0]


@pytest.mark.parametrize("suite", ["instella_pretrain", "instella_instruct", "amd_llama_135m"])
def test_offline_suite_group_aggregate_is_the_suite_score(index, suite):
    """The offline twins' members are single tasks: there lm-eval's own group aggregate (`primary_score`, or the
    common `acc`, unweighted) equals the report's suite score, the mean of the columns' primary metrics."""
    groups: dict[str, Group] = {}
    root = build(index, f"{suite}_offline", groups)
    settings = settings_by_name()
    rng = random.Random(1)
    results, members = {}, {m.offline_task: m for m in make_tasks.SUITES[suite]}
    for leaf in root.get_all_tasks():
        primary = members[leaf.task_name].metric  # "<metric>,none"
        value = round(rng.random(), 4)
        results[leaf.task_name] = {"sample_len": rng.randint(5, 50), primary: value, "primary_score,none": value}
        assert leaf.task_name.removesuffix("_offline") in settings or suite == "amd_llama_135m"
    metrics = aggregate_groups(EvalAcc(metrics=results, groups=groups)).metrics
    published = report.load_published(suite)
    scores, offline = report.scores_from_results(metrics, suite, published)
    score, n = report.average(scores, list(published["columns"]))
    aggregated = metrics[f"{suite}_offline"][f"{make_tasks.suite_metric(suite)},none"]
    assert offline and n == len(root.get_all_tasks())
    assert aggregated * published["scale"] == pytest.approx(score)


def test_ifeval_reports_lm_evals_scores_and_its_primary_score():
    """IFEval keeps lm-eval's scoring unchanged and adds `primary_score` = prompt_level_loose_acc (its OLMES primary
    metric); a keyword instruction, which needs no NLTK data."""
    import json

    from lm_eval.tasks.ifeval.utils import process_results

    from instella_recipes.evaluation import olmes as olmes_code

    rows = [json.loads(line) for line in (make_tasks.EVAL_DIR / "data/offline/ifeval.jsonl").open()]
    doc = next(r for r in rows if r["instruction_id_list"] == ["keywords:existence"])
    for response, right in (("A cat: whiskers, and a purr.", True), ("A cat.", False)):
        ours = olmes_code.ifeval_results(doc, [response])
        assert ours == {**process_results(doc, [response]), "primary_score": right}
        assert ours["prompt_level_loose_acc"] is right
