"""Write eval/tasks/ (our lm-eval suites and their offline twins) from lm-eval's own task YAMLs.

    python scripts/make_eval_tasks.py            # rewrite eval/tasks/ (run after upgrading lm-eval; commit the diff)
    python scripts/make_eval_tasks.py --check    # exit 1 if the shipped YAMLs differ from what this writes (CI)

What is generated and why: `instella_recipes/evaluation/tasks.py`.
"""

try:
    from instella_recipes.evaluation.tasks import main
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
