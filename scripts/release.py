"""Turn any stage output into a Hub-ready folder (shards + index, remote code, tokenizer with chat template,
generation config, model card with the resolved hyperparameters and the eval table); the work is in
`instella_recipes.checkpoint.release`.

    python scripts/release.py --model_dir runs/demo/dpo --output_dir runs/demo/release \
        [--eval_results runs/demo/eval_dpo ...] [--push_to_hub --repo_id org/name]
"""

try:
    from instella_recipes.checkpoint.release import main
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
