"""Preference tuning (Instella-3B-SFT -> Instella-3B-Instruct) with TRL's DPOTrainer and length-normalised DPO.

    accelerate launch --config_file accelerate_configs/<x>.yaml scripts/dpo.py --config recipes/instella-3b/dpo.yaml
    python scripts/dpo.py --config recipes/tiny/dpo.yaml [--model_name_or_path M --output_dir O ...]

The settings (`CheckedDPOConfig`), the trainer (`InstellaDPOTrainer`) and the stage (`DPOStage`) live in
`instella_recipes/post_training/dpo.py`; see docs/post_training.md.
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

preflight("dpo", "recipes/tiny/dpo.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.post_training.dpo import main

if __name__ == "__main__":
    raise SystemExit(main())
