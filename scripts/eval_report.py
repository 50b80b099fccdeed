"""Our lm-eval results next to the published numbers: a markdown table and a grouped bar chart (PNG).

    python scripts/eval_report.py --suite instella_pretrain --results runs/eval/stage1 [more result files or folders] \
        [--names stage1 ...] [--judge AE2=17.1 MT-B=7.0] --output_dir runs/report

`--results` takes lm-eval result JSON files (`results_<date>.json`) or the folders lm-eval wrote them into (the newest
file under each folder is read). Each becomes one row. Scores are read per suite member with the metric the suite
reports (scripts/make_eval_tasks.py SUITES), from the online task name or, failing that, its offline twin (rows built
from
offline tasks are marked, since those are sample items, not the benchmark). Our fractions are scaled like the
published table (percent for Instella, fractions for AMD-Llama-135m). The average is computed the authors' way: the
plain mean of all columns, MT-Bench included on its 0-10 scale; a row missing a column gets its average over the
columns it has, marked with the count.
"""

import sys
from dataclasses import dataclass, field

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.evaluation.report import write_report


@dataclass
class ReportArguments:
    suite: str = field(default=None, metadata={"help": "A suite of eval/published, or tiny_world."})
    results: list[str] = field(default_factory=list, metadata={"help": "lm-eval result JSON files or folders."})
    names: list[str] | None = field(default=None, metadata={"help": "Row names, in the order of --results."})
    judge: list[str] = field(default_factory=list, metadata={"help": "Judge scores, e.g. AE2=17.5 MT-B=7.1."})
    output_dir: str = field(default=None, metadata={"help": "Folder for <suite>.md and <suite>.png."})

    def __post_init__(self):
        if not self.suite or not self.results or not self.output_dir:
            raise ValueError("--suite, --results and --output_dir are required")


def _parse_judge(items: list[str]) -> dict[str, float]:
    out = {}
    for item in items:
        label, sep, value = item.partition("=")
        try:
            out[label] = float(value) if sep else float("x")
        except ValueError as error:
            raise RecipeError(f"--judge expects LABEL=NUMBER, got {item!r}") from error
    return out


@exit_on_recipe_error
def main(argv=None) -> int:
    (args,) = parse_recipe([ReportArguments], argv)
    setup_logging()
    table, png = write_report(args.suite, args.results, args.output_dir, args.names, _parse_judge(args.judge))
    sys.stdout.write(table.read_text())  # the table is this command's output
    sys.stderr.write(f"wrote {table} and {png}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
