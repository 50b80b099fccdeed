"""Average N checkpoints element-wise (Instella: the three stage-2 seeds), tensor by tensor.

    python scripts/merge.py --inputs A B C --output_dir O [--weights 0.5 0.25 0.25] [--dtype float32]

Each input is an HF folder with safetensors weights. Tensors are read lazily (`safe_open`), one key at a time,
averaged bitwise as the authors' `scripts/merge_ckpts.py` does (summed in order in the checkpoints' dtype, then
divided by the count; weighted means in fp32) and written per output shard, so memory stays near one model's size
plus one tensor per input. Configs (ignoring bookkeeping fields) and key sets must match. The output folder gets the
first input's config, remote-code files, generation config and tokenizer, then `manifest.json` last.
"""

try:
    from instella_recipes.checkpoint.merge import main
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
