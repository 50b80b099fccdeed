"""FSDP mixed precision as the authors ran it (OLMo `fsdp.precision: mixed`, `instella/config.py` `fsdp_precision`):
parameters gathered and computed in bf16, gradients reduced across ranks in fp32.

accelerate's `mixed_precision: bf16` gives FSDP a policy that reduces in bf16, and neither its config file nor its
environment variables can ask for another reduce dtype. `FSDPReduceDtypeMixin` replaces the policy on accelerate's
FSDP plugin with torch's public `MixedPrecisionPolicy` (FSDP2) / `MixedPrecision` (FSDP1) right after the
Accelerator exists and before `train()` wraps the model, so accelerate's own `fully_shard` call applies it.
"""

import torch


class FSDPReduceDtypeMixin:
    """Mix into a `Trainer` (or TRL's trainers) before the trainer class. The subclass sets `self.fsdp_reduce_dtype`
    (a torch dtype name, or None to keep accelerate's policy) before calling `Trainer.__init__`."""

    fsdp_reduce_dtype: str | None = "float32"

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
