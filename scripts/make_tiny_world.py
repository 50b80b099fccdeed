"""Write the tiny synthetic world (the demo's data, no downloads): `python scripts/make_tiny_world.py
--config recipes/tiny/tiny_world.yaml --output_dir runs/demo/data`.

Writes `corpus.jsonl` (pretraining text), `sft.jsonl` (chat; `sft_facts.jsonl` holds its fact questions alone, for
upsampling), `preferences.jsonl` (DPO pairs), `eval_mc.jsonl` and `eval_arithmetic.jsonl` (held-out evaluation
items), then `manifest.json` with the world's parameters, row counts
and file digests. The generator is `instella_recipes/data/tiny_world.py`; the same seed gives byte-identical files.
"""

try:
    from instella_recipes.data.tiny_world import main
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
