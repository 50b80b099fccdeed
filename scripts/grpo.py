"""GRPO (Instella-3B-Math-SFT -> Instella-3B-Math) with TRL's GRPOTrainer and the authors' VERL objective.

    accelerate launch --config_file accelerate_configs/<x>.yaml scripts/grpo.py \
        --config recipes/instella-3b-math/grpo_stage1.yaml
    python scripts/grpo.py --config recipes/tiny/grpo.yaml [--model_name_or_path M --output_dir O ...]

The settings (`CheckedGRPOConfig`, TRL's GRPOConfig plus the stage's fields), the trainer (`InstellaGRPOTrainer`) and
the run live in `instella_recipes/post_training/grpo.py`; see docs/instella_math.md.
"""

try:
    from instella_recipes.trainer.stop_requests import catch_stop_requests
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    catch_stop_requests()  # first: the imports below take seconds, and a SIGTERM during them must not be fatal

from instella_recipes.core.command_line import preflight

preflight("grpo", "recipes/tiny/grpo.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.post_training.grpo import main

if __name__ == "__main__":
    raise SystemExit(main())
