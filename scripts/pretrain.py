"""Pretrain a causal LM on prepared packed windows with the transformers Trainer.

    accelerate launch --config_file accelerate_configs/<shape>.yaml scripts/pretrain.py \
        --config recipes/instella-3b/pretrain_stage1.yaml [--output_dir O --data_dir D --seed S ...]

The model comes from `model_name_or_path` (continue from a checkpoint with a fresh optimizer and schedule: stage 2)
or from `model_config` (from scratch). Every input check runs before the first step; see docs/pretraining.md.
The settings (`PretrainArguments`) and the run live in `instella_recipes/pretraining/pretrain.py`.
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

preflight("pretrain", "recipes/tiny/pretrain_stage1.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.trainer.stop_requests import catch_stop_requests

if __name__ == "__main__":
    catch_stop_requests()  # first: the imports below take seconds, and a SIGTERM during them must not be fatal

from instella_recipes.pretraining.pretrain import main

if __name__ == "__main__":
    raise SystemExit(main())
