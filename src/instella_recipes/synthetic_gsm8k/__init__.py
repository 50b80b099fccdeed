"""Synthetic GSM8K (SPEC.md 2): the published 4-step method (pipeline.py), its prompts (prompts/), generation
backends (backends.py), the sandbox for generated programs (sandbox.py, sandbox_worker.py) and the run driver
(run.py) behind `scripts/synthetic_gsm8k.py`. The sandbox modules use the standard library only."""
