"""Instella's optimizer and LR schedule through the Trainer's extension points (works for Trainer and TRL trainers).

- Weight decay on **every** parameter, norms and embeddings included (the Trainer exempts norms and biases).
- The OLMo schedule: linear warmup from `warmup_start_factor` (0.1) x peak to the peak, then cosine or linear decay
  to `alpha_f` x peak at the last step (transformers' warmups start from 0). It is selected by putting `alpha_f` in
  `lr_scheduler_kwargs`; `lr_scheduler_type` ("cosine" or "linear") picks the decay. Without `alpha_f` the
  Trainer's own schedulers are used unchanged.
"""

import math
from functools import partial

from torch.optim.lr_scheduler import LambdaLR


def olmo_lr_factor(
    step: int, *, warmup_steps: int, total_steps: int, decay: str, alpha_f: float, warmup_start_factor: float = 0.1
) -> float:
    """LR multiplier at optimizer step `step` (0-based), as OLMo's CosWithWarmup / LinearWithWarmup define it."""
    if step < warmup_steps:
        return warmup_start_factor + (1.0 - warmup_start_factor) * step / warmup_steps
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    if decay == "cosine":
        return alpha_f + (1.0 - alpha_f) * (1 + math.cos(math.pi * progress)) / 2
    if decay == "linear":
        return alpha_f + (1.0 - alpha_f) * (1 - progress)
    raise ValueError(f"unknown decay '{decay}' for the OLMo schedule: use lr_scheduler_type 'cosine' or 'linear'")


def olmo_scheduler(optimizer, *, warmup_steps, total_steps, decay, alpha_f, warmup_start_factor=0.1) -> LambdaLR:
    factor = partial(
        olmo_lr_factor,
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        decay=decay,
        alpha_f=alpha_f,
        warmup_start_factor=warmup_start_factor,
    )
    return LambdaLR(optimizer, factor)


class InstellaOptimMixin:
    """Mix into a `Trainer` (or TRL's `SFTTrainer` / `DPOTrainer`) before the trainer class:
    `class MyTrainer(InstellaOptimMixin, SFTTrainer): ...`."""

    def get_decay_parameter_names(self, model) -> list[str]:
        return [name for name, _ in model.named_parameters()]

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        kwargs = dict(self.args.lr_scheduler_kwargs or {})
        if self.lr_scheduler is None and "alpha_f" in kwargs:
            decay = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
            self.lr_scheduler = olmo_scheduler(
                optimizer or self.optimizer,
                warmup_steps=self.args.get_warmup_steps(num_training_steps),
                total_steps=num_training_steps,
                decay=decay,
                alpha_f=float(kwargs["alpha_f"]),
                warmup_start_factor=float(kwargs.get("warmup_start_factor", 0.1)),
            )
            self._created_lr_scheduler = True
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)
