"""Reshape a torch.distributed.checkpoint (DCP) directory: N writers -> M, or -> a Hugging Face safetensors folder.

    # N -> M: launch with M processes (gloo on CPU is enough; no GPU needed)
    torchrun --nproc_per_node 2 scripts/reshape_checkpoint.py --input ckpt_n4 --output ckpt_m2 \
        --model_config run/config.json
    # N -> 1 (a single process, no launcher)
    python scripts/reshape_checkpoint.py --input ckpt_m2 --output ckpt_m1
    # -> HF folder (model weights + config; optimizer state is dropped)
    python scripts/reshape_checkpoint.py --input ckpt_m2 --output hf_model --to hf --model_config run/config.json

Model and optimizer state are reshaped together (every key of the checkpoint). With `--model_config` the checkpoint is
first checked against the model the config describes; a mismatch is an error before anything is written. The output
appears only when complete (written to `<output>.partial`, then renamed). How: instella_recipes/checkpoint/reshape.py.
"""

try:
    from instella_recipes.checkpoint.reshape import main
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
