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

import os
from dataclasses import dataclass, field

import torch.distributed as dist

from instella_recipes.checkpoint.reshape import export_hf, load_config, read_metadata, reshard, writer_count
from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging


@dataclass
class ReshapeArguments:
    input: str = field(default=None, metadata={"help": "DCP checkpoint directory (the one holding .metadata)"})
    output: str = field(default=None, metadata={"help": "output directory (must not exist unless --overwrite)"})
    to: str = field(default="dcp", metadata={"help": "dcp: one file per launched process; hf: safetensors folder"})
    model_config: str = field(
        default=None, metadata={"help": "config.json (or its folder) of the model; needed for hf"}
    )
    model_key: str = field(default=None, metadata={"help": "top-level key of the model state (default: 'model')"})
    dtype: str = field(default=None, metadata={"help": "hf only: cast weights, e.g. bfloat16"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output directory"})


@exit_on_recipe_error
def main(argv=None):
    (args,) = parse_recipe([ReshapeArguments], argv)
    setup_logging()
    if not args.input or not args.output:
        raise RecipeError("give --input <DCP checkpoint dir> and --output <dir>")
    if args.to not in ("dcp", "hf"):
        raise RecipeError(f"--to {args.to!r}: choose dcp or hf")
    metadata = read_metadata(args.input)
    if args.to == "hf":
        if not args.model_config:
            raise RecipeError("--to hf needs --model_config (the model's config.json or its folder)")
        if int(os.environ.get("WORLD_SIZE", 1)) > 1:
            raise RecipeError("--to hf runs in one process: launch without torchrun")
        path = export_hf(args.input, args.output, args.model_config, model_key=args.model_key, dtype=args.dtype,
                         overwrite=args.overwrite)  # fmt: skip
        print(f"wrote Hugging Face model to {path}")
        return
    config = load_config(args.model_config) if args.model_config else None
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")  # resharding moves tensors through CPU memory; gloo is enough
    try:
        world = dist.get_world_size() if dist.is_initialized() else 1
        path = reshard(args.input, args.output, config=config, model_key=args.model_key, overwrite=args.overwrite)
        if not dist.is_initialized() or dist.get_rank() == 0:
            print(f"resharded {args.input} ({writer_count(metadata)} writers) -> {path} ({world} writers)")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
