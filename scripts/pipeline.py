"""Run a model's whole recipe as one stage graph (`instella_recipes.pipeline.cli`):

    python scripts/pipeline.py --config recipes/tiny/pipeline.yaml [--output_dir runs/demo] [--set steps=20]
    python scripts/pipeline.py --config recipes/instella-3b/pipeline.yaml --executor slurm --wait

Stages run in dependency order, complete ones are skipped; `--stage NAME` runs one stage (or matrix entry), `--dry_run`
says what would run and why. The format: docs/pipeline.md; the Slurm executor: docs/slurm.md.
"""

try:
    from instella_recipes.core.command_line import preflight
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

preflight("pipeline", "recipes/tiny/pipeline.yaml")  # before the slow imports (a wrong command line fails fast)

from instella_recipes.pipeline.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
