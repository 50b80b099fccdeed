"""Shared helpers of the pretraining tests: a prepared tiny-world folder and a tiny-model pretrain command line."""

import json

from instella_recipes.data.prepare import PrepareArguments, prepare

TINY_MODEL = {
    "model_type": "instella", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 128,
}  # fmt: skip


def prepare_tiny(folder, seq_len: int = 64, **overrides):
    args = PrepareArguments(
        output_dir=str(folder), sources=[{"tiny_world": {"seed": 1234}, "name": "tiny_world"}],
        train_tokenizer_vocab_size=512, seq_len=seq_len, seed=6198, num_proc=1, **overrides,
    )  # fmt: skip
    return prepare(args)


def pretrain_argv(data_dir, output_dir, max_steps: int = 8, **overrides) -> list[str]:
    """CLI args of a tiny from-scratch run (global batch 4 x 64 tokens, OLMo schedule, log every step)."""
    values = {
        "data_dir": data_dir, "output_dir": output_dir, "model_config": json.dumps(TINY_MODEL), "max_steps": max_steps,
        "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "global_batch_size": 4,
        "learning_rate": 3e-3, "lr_scheduler_type": "cosine", "lr_scheduler_kwargs": '{"alpha_f": 0.1}',
        "warmup_steps": 3, "weight_decay": 0.1, "adam_beta2": 0.95, "max_grad_norm": 1.0, "seed": 6198,
        "logging_steps": 1, "save_strategy": "steps", "save_steps": 4, "report_to": "none", "disable_tqdm": "true",
        "dataloader_drop_last": "true", "resume_from_checkpoint": "auto", "use_cpu": "true",
    }  # fmt: skip
    values.update(overrides)
    argv = []
    for key, value in values.items():
        argv += [f"--{key}", str(value)]
    return argv


def fail_before_first_step(model, plugin_args: dict) -> list:
    """A plugin whose callback raises when training begins: a run that dies after its checks, before any step."""
    from transformers import TrainerCallback

    class Fail(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            raise RuntimeError("injected failure before the first step")

    return [Fail()]


def resume_on_one_process(data_dir, two_process_run, folder) -> None:
    """Copy checkpoint-2 of a 2-process run (4 steps, batch 2 per device) into `folder` and finish it on 1 process
    with accumulation 2: the same global batch, so the same samples per step."""
    import shutil

    from instella_recipes.pretraining.pretrain import main

    folder.mkdir()
    shutil.copytree(two_process_run / "checkpoint-2", folder / "checkpoint-2")
    shutil.copy(two_process_run / "run.json", folder / "run.json")
    argv = pretrain_argv(data_dir, folder, max_steps=4, save_steps=2, per_device_train_batch_size=2,
                         gradient_accumulation_steps=2)  # fmt: skip
    assert main(argv) == 0
