"""Prepare pretraining data: read the recipe's sources, tokenise (no BOS, EOS appended), then either mix and pack
fixed windows (`layout: packed`, what `scripts/pretrain.py --data_dir` reads) or write the OLMo token files the
authors trained Instella on, as `dolma tokens` writes them (`layout: olmo`, one folder per source).

    python scripts/prepare_data.py --config recipes/tiny/prepare_data.yaml [--output_dir D --tokenizer T ...]
    python scripts/prepare_data.py --config recipes/instella-3b/prepare_stage2.yaml [--only flan --num_proc 64]

Runs on CPU nodes before training.
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

preflight("prepare_data", "recipes/tiny/prepare_data.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.data.prepare import main

if __name__ == "__main__":
    raise SystemExit(main())
