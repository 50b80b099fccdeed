"""Sizing rules for a model on a cluster (SPEC.md 5-6): parameters (total / active), FLOPs per token, GEMM shapes with
alignment flags, vocab padding, memory per GPU under DDP / ZeRO-1 / FSDP full / hybrid shard, tokens/s at a target
MFU on MI300X, H100 and H200.

    python scripts/sizing.py --model instella-3b --nodes 16 --gpus_per_node 8 --micro_batch 4 --seq_len 4096
    python scripts/sizing.py --model recipes/zaya1/zaya1_base_mi300x.yaml --nodes 16 --target_mfu 0.3
    python scripts/sizing.py --model runs/demo/stage1/config.json --json      # T defaults to the model's context
    python scripts/sizing.py --model instella-3b --gpus_per_node 1 --seq_len 2048 --lora_r 16 --weight_bytes 2

    python scripts/sizing.py --model instella-3b --nodes 8 --long_context true   # Instella-Long: 64K/256K x SP 1/2/4/8

`--model`: a preset (instella-3b, amd-llama-135m, zaya1-base, olmoe-1b-7b), an HF config.json or model folder, or a
recipe YAML (its model_config / model_name_or_path). The formulas: instella_recipes/systems/sizing.py.
"""

try:
    from instella_recipes.systems.sizing import main
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
