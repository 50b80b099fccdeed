"""The fp32 gradient reduce (a training feature, `features/__init__.py`): FSDP mixed precision as the authors ran it
(OLMo `fsdp.precision: mixed`, `instella/config.py` `fsdp_precision`): parameters gathered and computed in bf16,
gradients reduced across ranks in fp32.

accelerate's `mixed_precision: bf16` gives FSDP a policy that reduces in bf16, and neither its config file nor its
environment variables can ask for another reduce dtype. `FSDPReduceDtypeMixin` replaces the policy on accelerate's
FSDP plugin with torch's public `MixedPrecisionPolicy` (FSDP2) / `MixedPrecision` (FSDP1) right after the
Accelerator exists and before `train()` wraps the model, so accelerate's own `fully_shard` call applies it.
"""

from dataclasses import dataclass, field

import torch

from instella_recipes.core.checks import check_choice

from ..settings import RUN
from .feature import Feature

REDUCE_DTYPES = ("float32", "bfloat16")


@dataclass
class FSDPReduceArguments:
    """The recipe field of the fp32 reduce; a mixin of every training stage's settings class."""

    fsdp_reduce_dtype: str | None = field(
        default="float32",
        metadata={"role": RUN, "help": "FSDP with bf16: gradient reduce dtype (authors: float32); null: bf16."},
    )

    def __post_init__(self):
        if self.fsdp_reduce_dtype is not None:
            check_choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, REDUCE_DTYPES)
        parent = getattr(super(), "__post_init__", None)
        if parent is not None:
            parent()


class FSDPReduceDtypeMixin:
    """Mix into a `Trainer` (or TRL's trainers) before the trainer class: `fsdp_reduce_dtype=` a torch dtype name, or
    None to keep accelerate's policy."""

    def __init__(self, *args, fsdp_reduce_dtype: str | None = "float32", **kwargs):
        self.fsdp_reduce_dtype = fsdp_reduce_dtype  # read by create_accelerator_and_postprocess inside __init__
        super().__init__(*args, **kwargs)

    def create_accelerator_and_postprocess(self):
        super().create_accelerator_and_postprocess()
        plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
        if plugin is None or self.fsdp_reduce_dtype is None or self.accelerator.mixed_precision != "bf16":
            return
        reduce_dtype = getattr(torch, self.fsdp_reduce_dtype)
        if plugin.fsdp_version == 2:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            plugin.mixed_precision_policy = MixedPrecisionPolicy(
                param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, output_dtype=torch.bfloat16
            )
        else:
            from torch.distributed.fsdp import MixedPrecision

            plugin.mixed_precision_policy = MixedPrecision(
                param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype, buffer_dtype=torch.float32
            )


FEATURE = Feature(
    name="fp32_reduce",
    settings=FSDPReduceArguments,
    trainer_mixin=FSDPReduceDtypeMixin,
    trainer_kwargs=lambda stage, data, model: {"fsdp_reduce_dtype": stage.args.fsdp_reduce_dtype},
)
