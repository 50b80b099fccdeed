"""Our lm-eval results next to the published numbers: a markdown table and a grouped bar chart (PNG).

    python scripts/eval_report.py --suite instella_pretrain --results runs/eval/stage1 [more result files or folders] \
        [--names stage1 ...] [--judge AE2=17.1 MT-B=7.0] --output_dir runs/report

`--results` takes lm-eval result JSON files or the folders lm-eval wrote them into; each becomes one row. Which
metric, which scale, how averages are computed: `instella_recipes/evaluation/report.py`.
"""

try:
    from instella_recipes.evaluation.report import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    raise SystemExit(main())
