"""The evaluation report (`scripts/eval_report.py`): lm-eval results beside the published numbers, as a markdown table
and a grouped bar chart (PNG).

`results` are lm-eval result JSON files (`results_<date>.json`) or the folders lm-eval wrote them into (the newest
file under each folder is read). Each becomes one row. Scores are read per suite member with the metric the suite
reports (`evaluation/tasks.py` SUITES), from the online task name or, failing that, its offline twin (rows built from
offline tasks are marked, since those are sample items, not the benchmark). Our fractions are scaled like the
published table (percent for Instella, fractions for AMD-Llama-135m). The average is computed the authors' way: the
plain mean of all columns, MT-Bench included on its 0-10 scale; a row missing a column gets its average over the
columns it has, marked with the count.
"""

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from instella_recipes.core import RecipeError, exit_on_recipe_error, get_logger, parse_recipe, setup_logging
from instella_recipes.core.paths import PUBLISHED_DIR
from instella_recipes.core.variables import split_assignment
from instella_recipes.evaluation.olmes_settings import CAVEATS
from instella_recipes.evaluation.results import eval_result_files, load_result_json
from instella_recipes.evaluation.tasks import SUITES, TINY_WORLD_METRICS

logger = get_logger(__name__)


def load_published(suite: str) -> dict:
    """The published table of a suite (columns, models, scale, source); tiny_world has none."""
    if suite == "tiny_world":
        return {"suite": suite, "source": "no published numbers (the project's synthetic world)", "scale": 100,
                "columns": {name: name for name in TINY_WORLD_METRICS}, "models": {}}  # fmt: skip
    path = PUBLISHED_DIR / f"{suite}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in PUBLISHED_DIR.glob("*.yaml")) + ["tiny_world"]
        raise RecipeError(f"unknown suite {suite!r}; known: {', '.join(known)}")
    return yaml.safe_load(path.read_text())


def find_result_file(path: str | Path) -> Path:
    """The lm-eval result file at `path`: the file itself, or the newest one in the folder."""
    files = eval_result_files([path]) if Path(path).exists() else []
    if not files:
        raise RecipeError(f"no lm-eval result file at {path} (expected results_*.json or a folder holding one)")
    return max(files, key=lambda f: f.stat().st_mtime)


def _member_keys(suite: str, member: str) -> tuple[str, list[str]]:
    """(metric, candidate task names in lookup order) of one suite member."""
    if suite == "tiny_world":
        return TINY_WORLD_METRICS[member], [member]
    for m in SUITES[suite]:
        if m.name == member:
            return m.metric, [m.name, m.offline_task]
    raise RecipeError(f"{member!r} is not a member of suite {suite!r}")


def scores_from_results(results: dict, suite: str, published: dict) -> tuple[dict[str, float], bool]:
    """Column label -> our score on the published scale; and whether any came from offline tasks."""
    scores, offline = {}, False
    for label, member in published["columns"].items():
        if member is None:
            continue
        metric, names = _member_keys(suite, member)
        for name in names:
            value = results.get(name, {}).get(metric)
            if isinstance(value, (int, float)):
                scores[label] = float(value) * published["scale"]
                offline |= name.endswith("_offline")
                break
    return scores, offline


def measurement_notes(suite: str, published: dict) -> list[str]:
    """Per column: how the published number was measured and whether ours is measured the same way (an OLMES
    setting for OLMES numbers, lm-eval's task for lm-eval numbers), with any difference that remains."""
    harness = published.get("harness")
    if suite == "tiny_world" or not harness:
        return []
    lines = []
    for label, member in published["columns"].items():
        if member is None:
            lines.append(f"- {label}: LLM-judged; not measured by lm-eval here (pass it with --judge)")
            continue
        m = next(m for m in SUITES[suite] if m.name == member)
        metric = m.metric.split(",")[0]
        if (harness == "OLMES") == (m.setting is not None):
            how = f"OLMES `{m.setting}`" if m.setting else f"lm-eval `{m.name}`"
            note = CAVEATS.get(m.setting or "")
            lines.append(
                f"- {label}: same setting, {how}, {metric}" + (f" (not proven exact: {note})" if note else "")
            )
        else:
            lines.append(
                f"- {label}: MEASURED DIFFERENTLY: published with {harness}, ours lm-eval `{m.name}` ({metric})"
            )
    return lines


def average(row: dict[str, float], columns: list[str]) -> tuple[float, int]:
    present = [row[c] for c in columns if c in row and not math.isnan(row[c])]
    return (sum(present) / len(present) if present else float("nan")), len(present)


def warn_not_a_number(file: Path, scores: dict[str, float]) -> None:
    """A NaN score (lm-eval writes one when a metric could not be computed, e.g. over no items) is shown as "-" and
    left out of the average, like a missing column: say so, naming the file and the columns."""
    bad = sorted(label for label, value in scores.items() if math.isnan(value))
    if bad:
        logger.warning(
            f"{file}: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} NaN (not a number: the metric could not "
            f"be computed); shown as '-' and left out of the average"
        )


def warn_not_numbers(file: Path, results: dict, suite: str, published: dict, scores: dict[str, float]) -> None:
    """A metric the result file holds as something other than a number (a string such as "N/A", a list) cannot be
    scored: its column is shown as "-" and left out of the average, like a missing one; say so, naming the column,
    the task, the metric and the file."""
    for label, member in published["columns"].items():
        if member is None or label in scores:
            continue
        metric, names = _member_keys(suite, member)
        for name in names:
            value = results.get(name, {}).get(metric)
            if value is not None:
                logger.warning(
                    f"{file}: {label} ({name} {metric}) is {value!r:.40} ({type(value).__name__}), not a number; "
                    f"shown as '-' and left out of the average"
                )
                break


def build_rows(suite, result_files, names=None, judge=None) -> tuple[dict, list[dict]]:
    """The published table plus one row per result file, each row {name, scores, avg, n, offline, kind}."""
    published = load_published(suite)
    columns = list(published["columns"])
    rows = []
    for i, path in enumerate(result_files):
        file = find_result_file(path)
        data = load_result_json(file)
        if "results" not in data:
            raise RecipeError(f"{path} is not an lm-eval result file (no 'results' key)")
        scores, offline = scores_from_results(data["results"], suite, published)
        warn_not_a_number(file, scores)
        warn_not_numbers(file, data["results"], suite, published, scores)
        for label, value in (judge or {}).items():
            if label not in columns:
                raise RecipeError(f"--judge {label}: not a column of {suite} ({', '.join(columns)})")
            scores[label] = value
        name = names[i] if names and i < len(names) else Path(path).stem
        avg, n = average(scores, columns)
        rows.append({"name": name, "scores": scores, "avg": avg, "n": n, "offline": offline, "kind": "ours"})
    for name, values in published["models"].items():
        scores = {c: float(values[c]) for c in columns if c in values}
        avg, n = average(scores, columns)
        rows.append({"name": name, "scores": scores, "avg": avg, "n": n, "published_avg": values.get("Avg"),
                     "offline": False, "kind": "published"})  # fmt: skip
    return published, rows


def _fmt(value, scale) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.2f}" if scale != 1 else f"{value:.4f}"


def markdown_table(published: dict, rows: list[dict]) -> str:
    columns, scale = list(published["columns"]), published["scale"]
    lines = ["| Model | Avg | " + " | ".join(columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for row in rows:
        name = row["name"] + (" (offline sample items)" if row["offline"] else "")
        avg = _fmt(row["avg"], scale) + (f" ({row['n']}/{len(columns)})" if row["n"] < len(columns) else "")
        if row["kind"] == "published" and row.get("published_avg") is not None:
            avg += f" [published {row['published_avg']}]"
        cells = [_fmt(row["scores"].get(c), scale) for c in columns]
        lines.append(f"| {name} | {avg} | " + " | ".join(cells) + " |")
    notes = [
        "",
        f"Published numbers: {published['source'].strip()}",
        f"Average: {published.get('average', 'mean of all columns')}.",
    ]
    measured = measurement_notes(published["suite"], published)
    if measured:
        notes += [
            "",
            f"How each column is measured (published: {published['harness']}; ours: lm-eval tasks):",
            *measured,
        ]
    return "\n".join(lines + notes) + "\n"


def chart_title(published: dict, rows: list[dict]) -> str:
    """ "ours (hatched) vs published" only where there are published rows (tiny_world has none)."""
    if any(row["kind"] == "published" for row in rows):
        return f"{published['suite']}: ours (hatched) vs published"
    return f"{published['suite']}: {', '.join(row['name'] for row in rows)} (no published numbers)"


def bar_chart(published: dict, rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = list(published["columns"]) + ["Avg"]
    width = 0.8 / max(1, len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(columns)), 4))
    for i, row in enumerate(rows):
        values = [row["scores"].get(c, float("nan")) for c in columns[:-1]] + [row["avg"]]
        xs = [j + (i - (len(rows) - 1) / 2) * width for j in range(len(columns))]
        hatch = "//" if row["kind"] == "ours" else None
        ax.bar(xs, [0 if math.isnan(v) else v for v in values], width, label=row["name"], hatch=hatch)
    ax.set_xticks(range(len(columns)), columns, rotation=30, ha="right")
    ax.set_ylabel("score (%)" if published["scale"] == 100 else "score")
    ax.set_title(chart_title(published, rows))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(suite, result_files, output_dir, names=None, judge=None) -> tuple[Path, Path]:
    published, rows = build_rows(suite, result_files, names, judge)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    table = output_dir / f"{suite}.md"
    table.write_text(f"# {suite}\n\n" + markdown_table(published, rows))
    png = bar_chart(published, rows, output_dir / f"{suite}.png")
    return table, png


# --- the command (scripts/eval_report.py) ---------------------------------------------------------------------------
@dataclass
class EvalReportArguments:
    """The settings of `scripts/eval_report.py`."""

    suite: str = field(default=None, metadata={"help": "A suite of eval/published, or tiny_world."})
    results: list[str] = field(default_factory=list, metadata={"help": "lm-eval result JSON files or folders."})
    names: list[str] | None = field(default=None, metadata={"help": "Row names, in the order of --results."})
    judge: list[str] = field(default_factory=list, metadata={"help": "Judge scores, e.g. AE2=17.5 MT-B=7.1."})
    output_dir: str = field(default=None, metadata={"help": "Folder for <suite>.md and <suite>.png."})

    def __post_init__(self):
        if not self.suite or not self.results or not self.output_dir:
            raise ValueError("--suite, --results and --output_dir are required")


def parse_judge(items: list[str]) -> dict[str, float]:
    """`["AE2=17.1", "MT-B=7.0"]` -> `{"AE2": 17.1, "MT-B": 7.0}`; a clear error for anything else (no `=`, no
    label: `split_assignment`, the project's one `VAR=VALUE` reader; a value that is no number)."""
    out = {}
    for item in items:
        label, value = split_assignment(item, "--judge", "LABEL=NUMBER")
        try:
            out[label] = float(value)
        except ValueError:
            raise RecipeError(f"--judge expects LABEL=NUMBER, got '{item}'") from None
    return out


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/eval_report.py`: write `<suite>.md` and `<suite>.png`; the table is also this command's output."""
    (args,) = parse_recipe([EvalReportArguments], argv)
    setup_logging()
    table, png = write_report(args.suite, args.results, args.output_dir, args.names, parse_judge(args.judge))
    sys.stdout.write(table.read_text())  # the table is this command's output
    sys.stderr.write(f"wrote {table} and {png}\n")
    return 0
