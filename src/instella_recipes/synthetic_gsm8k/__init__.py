"""Synthetic GSM8K (SPEC.md 2): the published 4-step method (pipeline.py), generation backends (backends.py) and the
run driver (run.py) behind `scripts/synthetic_gsm8k.py`; generated programs run in `instella_recipes.sandbox`."""
