"""Write the tiny synthetic world (the demo's data, no downloads): `python scripts/make_tiny_world.py
--config recipes/tiny/tiny_world.yaml --output_dir runs/demo/data`.

Writes `corpus.jsonl` (pretraining text), `sft.jsonl` (chat; `sft_facts.jsonl` holds its fact questions alone, for
upsampling), `preferences.jsonl` (DPO pairs), `eval_mc.jsonl` and `eval_arithmetic.jsonl` (held-out evaluation
items), then `manifest.json` with the world's parameters, row counts
and file digests. The generator is `instella_recipes/data/tiny_world.py`; the same seed gives byte-identical files.
"""

from instella_recipes.data.tiny_world import main

if __name__ == "__main__":
    raise SystemExit(main())
