"""Synthetic GSM8K (amd/Instella-GSM8K-synthetic, SPEC.md 2): the published 4-step method with a real sandbox.

    python scripts/synthetic_gsm8k.py --config recipes/synthetic_gsm8k/vllm_gsm8k_train.yaml [--seeds S ...]

Killed half way, the same command resumes. See docs/synthetic_gsm8k.md. Exit codes: 0 done, 2 bad input (before any
work), 1 the model server failed too often (the same command retries the seeds it left undone).
"""

from instella_recipes.core.command_line import preflight

preflight("synthetic_gsm8k", "recipes/synthetic_gsm8k/tiny.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.synthetic_gsm8k.run import main

if __name__ == "__main__":
    raise SystemExit(main())
