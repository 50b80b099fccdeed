"""Check an evaluation before any model work, then hand it to the real `lm_eval` CLI unchanged.

    python scripts/evaluate.py --model_dir runs/stage1 --tasks instella_pretrain_offline \
        [--num_fewshot N] [--limit N] [--output_path runs/eval/stage1] [-- <more lm_eval arguments>]

What is checked (model folder, task names, chat suites, every few-shot prompt against the model's context) and the
exact `lm_eval` command: `instella_recipes/evaluation/preflight.py`.
"""

try:
    from instella_recipes.evaluation.preflight import main
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
