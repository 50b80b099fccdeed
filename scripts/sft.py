"""Supervised fine-tuning (Instella-3B -> Instella-3B-SFT) with TRL's SFTTrainer.

    accelerate launch --config_file accelerate_configs/<x>.yaml scripts/sft.py --config recipes/instella-3b/sft.yaml
    python scripts/sft.py --config recipes/tiny/sft.yaml [--model_name_or_path M --output_dir O ...]

The settings (`CheckedSFTConfig`), the trainer (`InstellaSFTTrainer`) and the stage (`SFTStage`) live in
`instella_recipes/post_training/sft.py`; see docs/post_training.md.
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

preflight("sft", "recipes/tiny/sft.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.post_training.sft import main

if __name__ == "__main__":
    raise SystemExit(main())
