"""Write the report of a pipeline run (`instella_recipes.pipeline.report`):

python scripts/pipeline_report.py --run_dir runs/demo --expect eval/expected/tiny_demo.yaml
# -> runs/demo/report.md + PNG plots in runs/demo/report/; the run checked against a healthy run's ranges
"""

try:
    from instella_recipes.pipeline.report import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    main()
