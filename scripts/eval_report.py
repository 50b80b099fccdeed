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

from instella_recipes.evaluation.report import main

if __name__ == "__main__":
    raise SystemExit(main())
