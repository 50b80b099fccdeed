"""Synthetic GSM8K (amd/Instella-GSM8K-synthetic, SPEC.md 2): the published 4-step method with a real sandbox.

    python scripts/synthetic_gsm8k.py --config recipes/synthetic_gsm8k/vllm_gsm8k_train.yaml [--seeds S ...]

Killed half way, the same command resumes. See docs/synthetic_gsm8k.md. Exit codes: 0 done, 2 bad input (before any
work), 1 the model server failed too often (the same command retries the seeds it left undone).
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

preflight("synthetic_gsm8k", "recipes/synthetic_gsm8k/tiny.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from instella_recipes.synthetic_gsm8k.run import main

if __name__ == "__main__":
    raise SystemExit(main())
