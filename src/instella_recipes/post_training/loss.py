"""The SFT loss reduction: TRL's token mean (`mean`, the default) or open-instruct's `reduce_loss: sum` (`sum`,
Instella-Math SFT stage 2), as a small Trainer hook.

open-instruct (`finetune.py`, the authors' copy at AMD-AIG-AIMA/Instella-Math `sft/open_instruct/finetune.py`
L913-936) takes `CrossEntropyLoss(reduction="sum")` over each micro-batch's label tokens; `accelerator.backward`
(DeepSpeed: the engine) divides it by the accumulation steps, and data parallelism averages the gradients over
devices. So one update's gradient is the sum over every label token of the global batch / (accumulation x devices).

TRL's `SFTTrainer.compute_loss` divides the micro-batch's token sum by `num_items_in_batch`, which the Trainer
counts in `_get_num_items_in_batch`. With `sum` that count is 1 (the sum itself), and `loss_is_scaled_for_ga =
False` makes `Trainer.training_step` divide by the accumulation steps, as accelerate did for open-instruct; DDP/FSDP
average over devices. No transformers/TRL flag says "sum", hence the hook.
"""

import torch

from instella_recipes.core import RecipeError

LOSS_REDUCTIONS = ("mean", "sum")


def check_loss_reduction(reduction: str, average_tokens_across_devices: bool) -> None:
    """A RecipeError for an unknown reduction, or `sum` with a token count summed across devices (which would
    multiply the summed loss by the number of devices)."""
    if reduction not in LOSS_REDUCTIONS:
        raise RecipeError(f"loss_reduction must be one of {LOSS_REDUCTIONS}, not '{reduction}'")
    if reduction == "sum" and average_tokens_across_devices:
        raise RecipeError(
            "loss_reduction: sum needs average_tokens_across_devices: false (open-instruct sums each device's "
            "tokens and averages gradients over devices)"
        )


class LossReductionMixin:
    """Mix into an SFTTrainer before it; `loss_reduction="sum"` gives open-instruct's summed token loss."""

    def __init__(self, *args, loss_reduction: str = "mean", **kwargs):
        self.loss_reduction = loss_reduction
        super().__init__(*args, **kwargs)
        check_loss_reduction(loss_reduction, self.args.average_tokens_across_devices)
        if loss_reduction == "sum":
            # the summed loss is not yet divided by the accumulation steps: training_step does it
            self.loss_is_scaled_for_ga = False

    # private: the Trainer's only hook for the divisor TRL's compute_loss applies to the token sum [test_private_apis]
    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device):
        if self.loss_reduction == "sum":
            return torch.ones((), device=device)  # TRL divides the token sum by this: the sum itself
        return super()._get_num_items_in_batch(batch_samples, device)
