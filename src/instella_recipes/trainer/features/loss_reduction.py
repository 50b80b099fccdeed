"""The SFT loss reduction (`loss_reduction`): what the summed token cross-entropy of a step is divided by, as one
Trainer hook. TRL's `SFTTrainer.compute_loss` divides each micro-batch's token sum by `num_items_in_batch`, which the
Trainer counts once per optimizer step over the step's micro-batches in `_get_num_items_in_batch`; that count is the
one thing the three values change:

- `mean` (TRL's default): the label tokens of the step's micro-batches. With `average_tokens_across_devices: false`
  the device's own (the authors' Instella SFT `normalize_by_label_mask: true`, `instella/train.py` L705), with
  `true` (transformers' default) every device's, the loss then scaled by the device count.
- `sum` (open-instruct's `reduce_loss: sum`, Instella-Math SFT stage 2): 1, so the loss is the summed token CE.
  open-instruct (the authors' copy at AMD-AIG-AIMA/Instella-Math `sft/open_instruct/finetune.py` L913-936) takes
  `CrossEntropyLoss(reduction="sum")` per micro-batch; `accelerator.backward` (DeepSpeed: the engine) divides it by
  the accumulation steps and data parallelism averages the gradients over devices. Here `loss_is_scaled_for_ga =
  False` makes `Trainer.training_step` divide by the accumulation steps, and DDP/FSDP average over devices.
- `input_tokens` (the authors' Instella-Long SFT): every input token of the device's step, masked ones too (no
  `normalize_by_label_mask` on that branch: `batch_size_in_tokens = batch["input_ids"].numel() / seq_parallel_size`,
  AMD-AIG-AIMA/Instella `instella-long` 560ebe7 `instella/train.py` L872, used as `ce_loss / batch_size_in_tokens`
  at L786). The division by the SP size is `SequenceParallelMixin`'s, the same for every value (an SP group's ranks
  count the same row).

`sum` and `input_tokens` count per device, as their authors do, so they need `average_tokens_across_devices: false`
(a count summed over devices would change the weights of unequal rows, or multiply the summed loss by the devices).
No transformers/TRL flag sets the divisor, hence the hook.
"""

import torch

from instella_recipes.core import RecipeError

LOSS_REDUCTIONS = ("mean", "sum", "input_tokens")
LOSS_REDUCTION_HELP = (
    "The summed token CE of a step over: mean: its label tokens (TRL's); sum: 1 (open-instruct reduce_loss: sum); "
    "input_tokens: every input token, masked ones too, / SP size (the authors' Instella-Long SFT)."
)
# The key this one replaced, and what to write instead (core.recipe names it for a recipe that still has it).
RETIRED_KEYS = {
    "loss_normalizer": "SFT's divisor is now one key: loss_reduction: input_tokens (was loss_normalizer: "
    "input_tokens) or loss_reduction: mean (was label_tokens)"
}


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
    """Mix into an SFTTrainer before it: `loss_reduction=` one of LOSS_REDUCTIONS (module docstring)."""

    def __init__(self, *args, loss_reduction: str = "mean", **kwargs):
        self.loss_reduction = loss_reduction
        super().__init__(*args, **kwargs)
        check_loss_reduction(loss_reduction, self.args.average_tokens_across_devices)
        if loss_reduction == "sum":
            # the summed loss is not yet divided by the accumulation steps: training_step does it
            self.loss_is_scaled_for_ga = False

    # private: the Trainer's only hook for the divisor TRL's compute_loss applies to the token sum [test_private_apis]
    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device):
        """The divisor of the step's summed token CE (before SequenceParallelMixin divides it by the SP size)."""
        if self.loss_reduction == "sum":
            return torch.ones((), device=device)  # TRL divides the token sum by this: the sum itself
        if self.loss_reduction == "input_tokens" and batch_samples:
            return torch.tensor(sum(b["input_ids"].numel() for b in batch_samples), device=device)
        return super()._get_num_items_in_batch(batch_samples, device)
