"""Run under torchrun (tests only, gloo/CPU): one SFT update through `post_training/sft.py`'s trainer on 2 processes,
per device 1 row x accumulation 2. Each rank saves the rows it trained on (input_ids, labels as the loss saw them)
and the gradients the optimizer received, for tests/e2e/test_exactness_sft_loss.py to check against a hand computation.

    python -m torch.distributed.run --standalone --nproc_per_node 2 sft_loss_worker.py MODEL DATA OUT [FLAGS]
"""

import sys

import torch
import torch.distributed as dist
from transformers import TrainerCallback
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.post_training.sft import CheckedSFTConfig, build_trainer


class _Grads(TrainerCallback):
    def __init__(self, record):
        self.record = record

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.record["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def main(model_dir: str, data: str, out: str, *flags: str) -> None:
    torch.set_num_threads(1)
    argv = [
        "--model_name_or_path", model_dir, "--output_dir", f"{out}/run", "--sources", f"{{path: {data}}}",
        "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2", "--global_batch_size", "4",
        "--max_steps", "1", "--learning_rate", "1e-3", "--max_grad_norm", "0", "--max_length", "64",
        "--use_cpu", "true", "--bf16", "false", "--report_to", "none", "--save_strategy", "no", "--seed", "0",
        "--dataloader_num_workers", "0", "--disable_tqdm", "true", "--dtype", "float32", *flags,
    ]  # fmt: skip
    training_args, model_args = parse_recipe([CheckedSFTConfig, ModelConfig], argv)
    trainer, _ = build_trainer(training_args, model_args)
    record = {"rows": []}
    step = trainer.training_step

    def recording_step(model, inputs, num_items_in_batch=None):
        record["rows"].append({k: inputs[k].detach().clone() for k in ("input_ids", "labels")})
        return step(model, inputs, num_items_in_batch)

    trainer.training_step = recording_step
    trainer.add_callback(_Grads(record))
    trainer.train()
    torch.save(record, f"{out}/rank{dist.get_rank()}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:])
