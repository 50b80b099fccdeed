"""Run under torchrun (tests only, gloo/CPU): one SFT update through `post_training/sft.py`'s trainer on 2 processes
under accelerate's FSDP2 with `mixed_precision: bf16`, recording the dtype of every FSDP all-gather (the parameters the
forward computes with) and reduce-scatter (the gradient reduction), for tests/e2e/test_exactness_sft_fsdp.py.

accelerate refuses FSDP on CPU (its AcceleratorState keeps MULTI_CPU there), so this worker creates the shared
accelerator state first and marks it FSDP2 with an FSDP plugin, as `accelerate launch` with an FSDP2 config does on
GPUs; the SFT trainer then builds its Accelerator on that state, and accelerate's own `fully_shard` wraps the model.

    python -m torch.distributed.run --standalone --nproc_per_node 2 sft_fsdp_worker.py MODEL DATA OUT POLICY
POLICY: `recipe` (the recipe's `fsdp_reduce_dtype`, float32) or `accelerate` (None: accelerate's own policy).
"""

import json
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.post_training.sft import CheckedSFTConfig, build_trainer


def _fsdp2_on_cpu() -> None:
    state = Accelerator(cpu=True, mixed_precision="bf16").state
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["InstellaDecoderLayer"],
        reshard_after_forward=True,
        state_dict_type="SHARDED_STATE_DICT",
    )
    plugin.set_mixed_precision("bf16")  # what AcceleratorState does with an FSDP plugin and bf16
    state.fsdp_plugin = plugin
    state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP


def _record_collectives(seen: dict) -> None:
    """FSDP2's default comms call `dist.all_gather_single` / `dist.reduce_scatter_single`: note their input dtypes."""
    all_gather, reduce_scatter = dist.all_gather_single, dist.reduce_scatter_single

    def recorded_all_gather(output_tensor, input_tensor, *args, **kwargs):
        seen["all_gather"].add(str(input_tensor.dtype))
        return all_gather(output_tensor, input_tensor, *args, **kwargs)

    def recorded_reduce_scatter(*args, **kwargs):
        seen["reduce_scatter"].add(str(kwargs["input"].dtype))
        return reduce_scatter(*args, **kwargs)

    dist.all_gather_single, dist.reduce_scatter_single = recorded_all_gather, recorded_reduce_scatter


def main(model_dir: str, data: str, out: str, policy: str) -> None:
    torch.set_num_threads(1)
    argv = [
        "--model_name_or_path", model_dir, "--output_dir", f"{out}/run", "--sources", f"{{path: {data}}}",
        "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "1", "--max_steps", "1",
        "--max_length", "64", "--use_cpu", "true", "--bf16", "true", "--report_to", "none", "--save_strategy", "no",
        "--seed", "0", "--dataloader_num_workers", "0", "--disable_tqdm", "true", "--dtype", "float32",
    ]  # fmt: skip
    training_args, model_args = parse_recipe([CheckedSFTConfig, ModelConfig], argv)
    if policy == "accelerate":
        training_args.fsdp_reduce_dtype = None
    _fsdp2_on_cpu()
    seen = {"all_gather": set(), "reduce_scatter": set()}
    _record_collectives(seen)
    trainer, _ = build_trainer(training_args, model_args)
    trainer.train()
    record = {
        "wrapped": type(trainer.model_wrapped).__name__,
        "policy": repr(trainer.accelerator.state.fsdp_plugin.mixed_precision_policy),
        **{k: sorted(v) for k, v in seen.items()},
    }
    with open(f"{out}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(record, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
