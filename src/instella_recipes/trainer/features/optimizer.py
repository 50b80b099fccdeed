"""Instella's optimizer and LR schedule (a training feature every stage carries, `features/__init__.py`), through the
Trainer's extension points (works for Trainer and TRL trainers). Its settings are the library's own fields
(`learning_rate`, `weight_decay`, `adam_beta1/2`, `adam_epsilon`, `max_grad_norm`, `optim`, `lr_scheduler_type`,
`lr_scheduler_kwargs`, `warmup_steps`); its settings mixin `OptimizerArguments` gives them their role (`run`).

- Weight decay on **every** parameter, norms and embeddings included (the Trainer exempts norms and biases).
- The OLMo schedule: linear warmup from `warmup_start_factor` (0.1) x peak to the peak, then cosine or linear decay
  to `alpha_f` x peak at the last step (transformers' warmups start from 0). It is selected by putting `alpha_f` in
  `lr_scheduler_kwargs`; `lr_scheduler_type` ("cosine" or "linear") picks the decay. Without `alpha_f` the
  Trainer's own schedulers are used unchanged.

Step indexing (SPEC.md 2.1). The HF Trainer steps its `LambdaLR` *after* each optimizer step, so update k (1-based)
runs with the factor at k - 1. The authors' trainers do not all agree with that:
- OLMo/Instella (`instella/train.py`) increments `global_step` before it sets the LR: update k uses lr(k), so the
  first stage-1 update runs at 4.018e-5 and the last stage-2 update at exactly 0. `lr_step_offset: 1` (default).
- lit_gpt (AMD-Llama-135m, `pretrain/tinyllama.py`) sets the LR from the 0-based *micro*-iteration before each
  forward, with warmup and decay lengths counted in micro-iterations (steps x accumulation A). The optimizer steps on
  the last micro-iteration of update k, i.e. at iteration kA - 1, which is (k - 1/A) updates: `lr_step_offset` is
  1 - 1/A of the authors' run (0.0 for pretraining, A = 1; 0.5 for the code finetune, A = 2).
`lr_step_offset` (in `lr_scheduler_kwargs`) shifts the 0-based step LambdaLR hands in, so the formula stays the
authors' and only the indexing is ours.
"""

import math
from dataclasses import dataclass
from functools import partial

from torch.optim.lr_scheduler import LambdaLR

from instella_recipes.core import RecipeError
from instella_recipes.core.checks import check_range

from ..settings import RUN
from .feature import Feature

OLMO_STEP_OFFSET = 1.0


def olmo_lr_factor(
    step: float, *, warmup_steps: int, total_steps: int, decay: str, alpha_f: float, warmup_start_factor: float = 0.1
) -> float:
    """LR multiplier at scheduler step `step`, exactly as OLMo's `CosWithWarmup` / `LinearWithWarmup.get_lr`
    (`instella/optim.py`) define it; OLMo calls it with the 1-based update index. `step` may be fractional
    (lit_gpt's micro-iteration indexing, see the module docstring)."""
    if step < warmup_steps:
        return warmup_start_factor + (1.0 - warmup_start_factor) * step / warmup_steps
    if step >= total_steps:
        return alpha_f
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    if decay == "cosine":
        return alpha_f + (1.0 - alpha_f) * (1 + math.cos(math.pi * progress)) / 2
    if decay == "linear":
        return alpha_f + (1.0 - alpha_f) * (1 - progress)
    raise ValueError(f"unknown decay '{decay}' for the OLMo schedule: use lr_scheduler_type 'cosine' or 'linear'")


def _shifted(step: int, *, offset: float, **formula) -> float:
    return olmo_lr_factor(step + offset, **formula)


def olmo_scheduler(
    optimizer, *, warmup_steps, total_steps, decay, alpha_f, warmup_start_factor=0.1, step_offset=OLMO_STEP_OFFSET
) -> LambdaLR:
    """A `LambdaLR` whose factor for the Trainer's 0-based step s is the formula at s + `step_offset`, so the LR
    the optimizer applies in update k (1-based) is the formula at k - 1 + `step_offset` (OLMo: at k)."""
    factor = partial(
        _shifted,
        offset=float(step_offset),
        warmup_steps=warmup_steps,
        total_steps=total_steps,
        decay=decay,
        alpha_f=alpha_f,
        warmup_start_factor=warmup_start_factor,
    )
    return LambdaLR(optimizer, factor)


SCHEDULE_KEYS = ("alpha_f", "warmup_start_factor", "lr_step_offset")


def check_schedule_kwargs(kwargs: dict | None) -> None:
    """Unknown or out-of-range keys of an OLMo-schedule `lr_scheduler_kwargs` (with `alpha_f`) are a RecipeError
    (called before any work by the entry points, and again when the scheduler is built)."""
    kwargs = dict(kwargs or {})
    if "alpha_f" not in kwargs:
        return
    unknown = sorted(set(kwargs) - set(SCHEDULE_KEYS))
    if unknown:
        raise RecipeError(f"lr_scheduler_kwargs: unknown key(s) {unknown}; known: {SCHEDULE_KEYS}")
    check_range("lr_scheduler_kwargs.alpha_f", kwargs["alpha_f"], 0, 1)
    check_range("lr_scheduler_kwargs.warmup_start_factor", kwargs.get("warmup_start_factor", 0.1), 0, 1)
    offset = kwargs.get("lr_step_offset", OLMO_STEP_OFFSET)
    check_range("lr_scheduler_kwargs.lr_step_offset", offset, 0, 1, hint="OLMo 1, lit_gpt 1 - 1/accumulation")


@dataclass
class OptimizerArguments:
    """The optimizer's settings: the library's fields, each defining the run (`trainer/settings.py`)."""

    library_roles = dict.fromkeys(
        ("learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "weight_decay", "adam_beta1",
         "adam_beta2", "adam_epsilon", "max_grad_norm", "optim"),
        RUN,
    )  # fmt: skip


class InstellaOptimMixin:
    """Mix into a `Trainer` (or TRL's `SFTTrainer` / `DPOTrainer` / `GRPOTrainer`) before the trainer class:
    `class MyTrainer(InstellaOptimMixin, SFTTrainer): ...`."""

    def get_decay_parameter_names(self, model) -> list[str]:
        """Every parameter decays, norms (`q_norm`, `k_norm`, `model.norm`) and embeddings included: OLMo's
        `decay_norm_and_bias` as Instella set it, open-instruct's and VERL's `AdamW(model.parameters(),
        weight_decay=...)` (VERL `fsdp_workers.py` L312-316); the Trainer would exempt norms and biases."""
        return [name for name, _ in model.named_parameters()]

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        kwargs = dict(self.args.lr_scheduler_kwargs or {})
        if self.lr_scheduler is None and "alpha_f" in kwargs:
            check_schedule_kwargs(kwargs)
            decay = str(getattr(self.args.lr_scheduler_type, "value", self.args.lr_scheduler_type))
            self.lr_scheduler = olmo_scheduler(
                optimizer or self.optimizer,
                warmup_steps=self.args.get_warmup_steps(num_training_steps),
                total_steps=num_training_steps,
                decay=decay,
                alpha_f=float(kwargs["alpha_f"]),
                warmup_start_factor=float(kwargs.get("warmup_start_factor", 0.1)),
                step_offset=float(kwargs.get("lr_step_offset", OLMO_STEP_OFFSET)),
            )
            # private: the Trainer rebuilds a scheduler it made on the next train(); no public flag [test_private_apis]
            self._created_lr_scheduler = True
            return self.lr_scheduler
        return super().create_scheduler(num_training_steps, optimizer)


FEATURE = Feature(
    name="optimizer",
    settings=OptimizerArguments,
    trainer_mixin=InstellaOptimMixin,
    check=lambda stage: check_schedule_kwargs(stage.args.lr_scheduler_kwargs),
)
