"""The loss reduction (`loss_reduction`, a training feature of pretraining and SFT, `features/__init__.py`): what the
summed token cross-entropy of a step is divided by, as one Trainer hook. TRL's `SFTTrainer.compute_loss` divides each
micro-batch's token sum by `num_items_in_batch`, which the Trainer counts once per optimizer step over the step's
micro-batches in `_get_num_items_in_batch`; that count is the one thing the three values change:

- `mean` (TRL's default): the label tokens of the step's micro-batches. With `average_tokens_across_devices: false`
  the device's own (the authors' Instella SFT `normalize_by_label_mask: true`, `instella/train.py` L705), with
  `true` (transformers' default) every device's, the loss then scaled by the device count.
- `sum` (open-instruct's `reduce_loss: sum`, Instella-Math SFT stage 2): 1, so the loss is the summed token CE.
  open-instruct (the authors' copy at AMD-AIG-AIMA/Instella-Math `sft/open_instruct/finetune.py` L913-936) takes
  `CrossEntropyLoss(reduction="sum")` per micro-batch; `accelerator.backward` (DeepSpeed: the engine) divides it by
  the accumulation steps and data parallelism averages the gradients over devices. Here `loss_is_scaled_for_ga =
  False` makes `Trainer.training_step` divide by the accumulation steps, and DDP/FSDP average over devices.
- `input_tokens` (OLMo/Instella pretraining, the authors' Instella-Long SFT): every input token of the device's step,
  masked ones too (`batch_size_in_tokens = batch["input_ids"].numel() / seq_parallel_size`, AMD-AIG-AIMA/Instella
  `instella-long` 560ebe7 `instella/train.py` L872, used as `ce_loss / batch_size_in_tokens` at L786; pretraining:
  `instella/train.py:707`). The division by the SP size is `SequenceParallelMixin`'s, the same for every value (an
  SP group's ranks count the same row). Pretraining's rows carry a label on every input token, so there the Trainer's
  own count is told the loss does not shift its labels (`_loss_shifts_labels = False`: it counts every label
  position, B x seq_len, and sums it over devices as transformers does); SFT's rows mask labels, so there the device's
  `input_ids` are counted (with `average_tokens_across_devices: false`).

`sum` and `input_tokens` count per device, as their authors do, so they need `average_tokens_across_devices: false`
(a count summed over devices would change the weights of unequal rows, or multiply the summed loss by the devices).
No transformers/TRL flag sets the divisor, hence the hook. (`mean` over pretraining's rows is transformers' and
lit_gpt's mean over the predicted tokens, AMD-Llama-135m's.)
"""

from dataclasses import dataclass, field

import torch

from instella_recipes.core import RecipeError

from ..settings import RUN
from .feature import Feature

LOSS_REDUCTIONS = ("mean", "sum", "input_tokens")
LOSS_REDUCTION_HELP = (
    "The summed token CE of a step over: mean: its label tokens (TRL's, transformers'); sum: 1 (open-instruct "
    "reduce_loss: sum); input_tokens: every input token, masked ones too, / SP size (OLMo/Instella: B x seq_len)."
)
# The key this one replaced, and what to write instead (core.recipe names it for a recipe that still has it).
RETIRED_KEYS = {
    "loss_normalizer": "the loss divisor is one key in every stage now: loss_reduction: input_tokens (was "
    "loss_normalizer: input_tokens) or loss_reduction: mean (was predicted_tokens / label_tokens)"
}


def loss_reduction_field(default: str):
    """The `loss_reduction` field with a stage's default (pretraining: input_tokens, OLMo's; SFT: mean, TRL's)."""
    return field(default=default, metadata={"role": RUN, "help": LOSS_REDUCTION_HELP})


@dataclass
class LossReductionArguments:
    """The recipe field of the loss reduction; a mixin of the stage's settings class, which may narrow the values
    (`loss_reductions`) and say whether its rows carry a label on every input token (`every_token_labelled`)."""

    retired_keys = RETIRED_KEYS  # core.recipe: a recipe that still has one gets what to write instead
    loss_reductions = LOSS_REDUCTIONS
    every_token_labelled = False

    loss_reduction: str = loss_reduction_field("mean")

    def __post_init__(self):
        if self.loss_reduction not in self.loss_reductions:
            raise RecipeError(f"loss_reduction must be one of {self.loss_reductions}, not '{self.loss_reduction}'")
        if not self.every_token_labelled:
            check_loss_reduction(self.loss_reduction, self.average_tokens_across_devices)
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


def check_loss_reduction(reduction: str, average_tokens_across_devices: bool) -> None:
    """A RecipeError for an unknown reduction, or a per-device one (`sum`, `input_tokens`) with a token count summed
    across devices."""
    if reduction not in LOSS_REDUCTIONS:
        raise RecipeError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, not '{reduction}'")
    if reduction == "sum" and average_tokens_across_devices:
        raise RecipeError(
            "loss_reduction: sum needs average_tokens_across_devices: false (open-instruct sums each device's "
            "tokens and averages gradients over devices)"
        )
    if reduction == "input_tokens" and average_tokens_across_devices:
        raise RecipeError(
            "loss_reduction: input_tokens needs average_tokens_across_devices: false (the authors divide by each "
            "device's own input tokens / SP size and average gradients over devices)"
        )


class LossReductionMixin:
    """Mix into a Trainer (pretraining's) or an SFTTrainer before it: `loss_reduction=` one of LOSS_REDUCTIONS
    (module docstring); `every_token_labelled=True` for rows with a label on every input token (pretraining's)."""

    def __init__(self, *args, loss_reduction: str = "mean", every_token_labelled: bool = False, **kwargs):
        self.loss_reduction = loss_reduction
        self.count_label_positions = every_token_labelled and loss_reduction == "input_tokens"
        super().__init__(*args, **kwargs)
        if self.count_label_positions:
            # private: the Trainer's only switch for counting input (not shifted label) tokens [test_private_apis]
            if not hasattr(self, "_loss_shifts_labels"):  # a transformers that counts the loss's tokens otherwise
                raise RuntimeError("loss_reduction input_tokens needs transformers' Trainer._loss_shifts_labels")
            self._loss_shifts_labels = False
            return
        check_loss_reduction(loss_reduction, self.args.average_tokens_across_devices)
        if loss_reduction == "sum":
            # the summed loss is not yet divided by the accumulation steps: training_step does it
            self.loss_is_scaled_for_ga = False

    # private: the Trainer's only hook for the divisor TRL's compute_loss applies to the token sum [test_private_apis]
    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device):
        """The divisor of the step's summed token CE (before SequenceParallelMixin divides it by the SP size)."""
        if self.loss_reduction == "sum":
            return torch.ones((), device=device)  # TRL divides the token sum by this: the sum itself
        if self.loss_reduction == "input_tokens" and not self.count_label_positions and batch_samples:
            return torch.tensor(sum(b["input_ids"].numel() for b in batch_samples), device=device)
        return super()._get_num_items_in_batch(batch_samples, device)


FEATURE = Feature(
    name="loss_reduction",
    settings=LossReductionArguments,
    trainer_mixin=LossReductionMixin,
    trainer_kwargs=lambda stage, data, model: {
        "loss_reduction": stage.args.loss_reduction,
        "every_token_labelled": stage.args.every_token_labelled,
    },
)
