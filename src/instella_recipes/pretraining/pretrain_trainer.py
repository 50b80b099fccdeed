"""`PretrainTrainer`: the transformers Trainer with pretraining's training features, atomic checkpoints and skipped
non-finite steps, all through the Trainer's extension points (no copy of its training loop).

- the training features of `FEATURES` (in that order, `trainer/features/`): MDS streaming (`streaming_rows=`),
  Ulysses sequence parallelism (`sequence_parallel=`), another run's AdamW state (`optimizer_state_from=`), the fp32
  gradient reduce under FSDP + bf16, Instella's optimizer (weight decay on every parameter, the OLMo schedule) and the
  loss reduction (`loss_reduction: input_tokens`, OLMo's `train_step` divisor B x seq_len, `instella/train.py:707`;
  `mean`: transformers' and lit_gpt's mean over the predicted tokens).
- `_save_checkpoint`: the Trainer writes the checkpoint into `<output_dir>/.staging/`, then the main process
  renames it into `<output_dir>/checkpoint-<step>` after every process finished (see `trainer/checkpoints.py`), and the
  Trainer's rotation (`save_total_limit`) runs on the real folder.
- `_get_train_sampler`: token files (`data_paths`) are read through `OLMoOrderSampler`, the authors' order laid out
  for accelerate's sharding of the Trainer's own dataloader (see `data/token_files.py` for why no library sampler
  does it); packed windows keep the Trainer's seeded random sampler.
- `create_accelerator_and_postprocess`: `ddp_timeout` applies to every backend (transformers passes it to
  `init_process_group` only off CPU), so a rank that dies or hangs fails the others within it.
- `_get_grad_norm`: the global (all-reduced) gradient norm decides whether a step is finite on every rank alike;
  a non-finite one makes the wrapped `optimizer.step` a no-op (the batch is dropped, the LR schedule and the step
  counter advance), and is counted in `skipped_steps`.

`NonFiniteCallback` reads those counts: it logs them, refuses periodic checkpoints while a streak of skipped steps
runs, and after `max_consecutive` in a row saves a checkpoint (its weights are from before the divergence, since no
update was applied) and stops the run, which the entry point reports as an error (exit code 3).
"""

import math
import os
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

from instella_recipes.trainer.checkpoints import STAGING, publish
from instella_recipes.trainer.features import (
    fp32_reduce,
    loss_reduction,
    mds_streams,
    optimizer,
    optimizer_state,
    sequence_parallel,
    trainer_mixins,
)

# Pretraining's training features, in order (the first is the outermost Trainer mixin); `PretrainArguments`,
# `PretrainTrainer` and `PretrainStage` all derive from this one tuple.
FEATURES = (
    mds_streams.FEATURE,
    sequence_parallel.FEATURE,
    optimizer_state.FEATURE,
    fp32_reduce.FEATURE,
    optimizer.FEATURE,
    loss_reduction.FEATURE,
)


class SamplerEpoch(TrainerCallback):
    """Gives the sampler the epoch each epoch starts in: the Trainer's own count, `global_step // steps per epoch`.
    The Trainer's `set_epoch` on its dataloader does not reach the sampler when accelerate has wrapped a multi-process
    batch sampler for a resume (`SkipBatchSampler` over `BatchSamplerShard`), so a run resumed inside epoch 1 or later
    would replay epoch 0's order."""

    def __init__(self, sampler):
        self.sampler = sampler

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.sampler.set_epoch(state.global_step // self.sampler.steps)


def apply_collective_timeout(seconds: int) -> None:
    """Give the default process group a collective timeout of `seconds` (`ddp_timeout`). transformers hands
    `ddp_timeout` to `init_process_group` only when not on CPU, so a gloo run kept torch's 30-minute default and a
    lost or hung rank held the others that long; torchtitan sets its timeouts the same way after start-up."""
    if dist.is_available() and dist.is_initialized():
        # private: torch has no public setter for a live group's timeout (only init_process_group) [test_private_apis]
        from torch.distributed.distributed_c10d import _set_pg_timeout

        _set_pg_timeout(timedelta(seconds=seconds))


class PretrainTrainer(*trainer_mixins(FEATURES), Trainer):
    """Trainer for packed-window causal LM pretraining (any AutoModelForCausalLM)."""

    def __init__(self, *args, train_sampler=None, **kwargs):
        self.train_sampler = train_sampler
        kwargs.setdefault("loss_reduction", "input_tokens")  # pretraining's default divisor (OLMo's), built by hand
        kwargs.setdefault("every_token_labelled", True)
        super().__init__(*args, **kwargs)
        self.skipped_steps = 0
        if hasattr(train_sampler, "set_epoch"):
            self.add_callback(SamplerEpoch(train_sampler))
        self.nonfinite_streak = 0
        self._skip_update = False

    # private: the Trainer's only hook for the columns `remove_unused_columns` keeps [test_private_apis]
    def _set_signature_columns_if_needed(self):
        """Keep `shift_labels` (PackedWindows' `predict_all_positions` rows): the model's forward takes it through
        `**kwargs` into transformers' causal-LM loss, so it is not among the forward's named parameters."""
        super()._set_signature_columns_if_needed()
        if "shift_labels" not in self._signature_columns:
            self._signature_columns.append("shift_labels")

    def create_accelerator_and_postprocess(self):
        """After the mixin's FSDP policy: `ddp_timeout` for every backend (`apply_collective_timeout`)."""
        super().create_accelerator_and_postprocess()
        apply_collective_timeout(self.args.ddp_timeout)

    # private: the Trainer takes no sampler argument; this is where it builds one [test_private_apis]
    def _get_train_sampler(self, train_dataset=None):
        """The sampler given at construction, else the Trainer's own. `OLMoOrderSampler` is no `RandomSampler`, so
        accelerate keeps it as it is (no seedable replacement) and only shards its batches across processes, which
        is the layout it is written for; `skip_first_batches` on resume then skips each rank's trained batches."""
        if self.train_sampler is not None:
            return self.train_sampler
        return super()._get_train_sampler(train_dataset)

    # --- non-finite steps ---------------------------------------------------------------------------------------
    def create_optimizer(self, *args, **kwargs):
        optimizer = super().create_optimizer(*args, **kwargs)
        if not getattr(optimizer, "_skips_nonfinite", False):
            step = optimizer.step

            def guarded_step(*a, **k):
                if self._skip_update:
                    return None
                return step(*a, **k)

            optimizer.step = guarded_step
            optimizer._skips_nonfinite = True
        return optimizer

    # private: the only place the norm is known before optimizer.step(); callbacks see it after [test_private_apis]
    def _get_grad_norm(self, model, grad_norm=None):
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        value = float(grad_norm) if grad_norm is not None else 0.0
        self._skip_update = not math.isfinite(value)
        if self._skip_update:
            self.skipped_steps += 1
            self.nonfinite_streak += 1
            model.zero_grad(set_to_none=True)
        else:
            self.nonfinite_streak = 0
        return grad_norm

    # --- atomic checkpoints -------------------------------------------------------------------------------------
    # private: each checkpoint the Trainer writes (periodic, final, JIT) goes here; no public hook [test_private_apis]
    def _save_checkpoint(self, model, trial) -> None:
        final_root = self.args.output_dir
        staging_root = os.path.join(final_root, STAGING)
        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        self.args.output_dir = staging_root
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.output_dir = final_root
        self.accelerator.wait_for_everyone()
        if self.args.should_save:
            publish(Path(staging_root) / name, Path(final_root) / name)
            rotate_checkpoints(
                output_dir=final_root,
                save_total_limit=self.args.save_total_limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
        self.accelerator.wait_for_everyone()


class NonFiniteCallback(TrainerCallback):
    """Stop after `max_consecutive` skipped (non-finite) steps in a row; keep checkpoints from before them."""

    def __init__(self, trainer, max_consecutive: int):
        self.trainer = trainer
        self.max_consecutive = max_consecutive
        self.diverged_at: int | None = None
        self.start_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step  # after a resume: the checkpoint's step

    def all_skipped(self) -> bool:
        """This session ran steps and skipped every one of them (nothing was trained: a failure, not a result)."""
        ran = self.trainer.state.global_step - self.start_step
        return ran > 0 and self.trainer.skipped_steps >= ran

    def on_step_end(self, args, state, control, **kwargs):
        streak = self.trainer.nonfinite_streak
        if streak:
            control.should_save = False  # no periodic checkpoints while a streak runs
            if streak >= self.max_consecutive:
                # No update was applied during the streak: the weights and optimizer state saved now are those from
                # before the divergence (the data position is past the bad batches).
                self.diverged_at = state.global_step - streak + 1
                control.should_save = True
                control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs["skipped_steps"] = self.trainer.skipped_steps
