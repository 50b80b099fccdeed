"""Convert Instella checkpoints between the OLMo training format and the Hub format, streaming tensor by tensor.

    python scripts/convert_checkpoint.py to-hub --input olmo_ckpt/ --model_config config.json --output hf_dir/
    python scripts/convert_checkpoint.py to-training --input hf_dir/ --output olmo_ckpt/
    python scripts/convert_checkpoint.py reconfigure --input hf_dir/ --output long_start/ --rope_theta 514640 \
        --max_position_embeddings 65536

Inputs are a safetensors file or a folder of safetensors shards (a `model.pt` / `.bin` file is read with
`torch.load(mmap=True)`). Tensors are read one at a time and written to shards of at most `--max_shard_size`, so a
3B (or 70B) checkpoint converts in about one shard of memory. The output is written into `<output>.partial` and
renamed when complete, so an interrupted run never leaves a folder that looks finished.
"""

try:
    from instella_recipes.checkpoint.convert import main
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
