"""Our lm-eval results next to the published numbers: a markdown table and a grouped bar chart (PNG).

    python scripts/eval_report.py --suite instella_pretrain --results runs/eval/stage1 [more result files or folders] \
        [--names stage1 ...] [--judge AE2=17.1 MT-B=7.0] --output_dir runs/report

`--results` takes lm-eval result JSON files or the folders lm-eval wrote them into; each becomes one row. Which
metric, which scale, how averages are computed: `instella_recipes/evaluation/report.py`.
"""

from instella_recipes.evaluation.report import main

if __name__ == "__main__":
    raise SystemExit(main())
