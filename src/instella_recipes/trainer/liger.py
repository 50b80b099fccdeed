"""Liger kernels for Instella through the ecosystem's own switch, `use_liger_kernel: true`.

liger-kernel (0.8.5) patches the model types of its table `liger_kernel.transformers.monkey_patch.
MODEL_TYPE_TO_APPLY_LIGER_FN`; transformers' `Trainer` (`integrations/liger.py: apply_liger_kernel`, which TRL's
trainers inherit) looks the model's `config.model_type` up there through liger's `_apply_liger_kernel_to_instance`,
and for "instella" it found nothing (transformers only logs that). `register()` adds `apply_liger_kernel_to_instella`
to that table; importing `instella_recipes.trainer` arranges for it to run as soon as liger's table module loads
(`liger_hook.py`: nothing heavy is imported before liger is), so nothing else changes:
the Trainer applies it to the model it trains (pretraining, SFT, DPO, GRPO). Why it is ours: liger has no patch for
this model type and the issue is not for a fork of liger; the patch below uses only liger's public modules and its
forward for Llama-shaped causal LMs.

What it swaps, on the model instance (the Trainer's path) or on the module's classes (`model=None`, before a model is
built, as liger's own patches):
- every RMSNorm (`pre_attention_layernorm`, `pre_feedforward_layernorm`, the final `model.norm` and the whole-width
  `q_norm` / `k_norm` of attention) -> `LigerRMSNorm(casting_mode="llama", in_place=False)`, sharing the weight
  Parameter. Instella's norm is Llama's: the mean square and the normalisation in fp32, the result cast back to the
  input dtype, then the weight (`InstellaRMSNorm`); liger's "llama" mode is that formula ("only rstd is computed in
  fp32 ... the multiplication with the weight is done on the original dtype", ops/rms_norm.py), where "gemma" would
  multiply by the weight in fp32 before the cast (OLMo-2's order). The one difference: Llama's `weight * x` promotes
  to the weight's dtype (fp32 masters under bf16 autocast) where liger stores the input dtype; the next matmul casts
  to bf16 either way, and the q/k norm output meets RoPE in bf16 instead of fp32. `in_place=False` because every
  norm's input is also the residual stream (or, for q/k, the projection) whose gradient is still needed.
- every MLP -> `LigerSwiGLUMLP` (`down(silu(gate(x)) * up(x))`, the gate/up/down Linear modules kept: LoRA adapters
  on them stay).
- the causal LM's forward -> liger's fused linear cross-entropy forward for Llama-shaped models (`lce_forward` of
  OLMo-2, the same forward as Instella's): in training with labels the logits are never materialised; the loss is
  the summed token CE divided by `num_items_in_batch` when the Trainer passes it (mean otherwise), with the Trainer's
  `shift_labels` honoured, exactly as transformers' `ForCausalLMLoss`. Every loss normalisation of our stages goes
  through that one divisor (pretraining's input tokens, SFT's `loss_reduction` mean / sum / input_tokens, the SP
  size in `SequenceParallelMixin`), so they are kept. TRL's SFT/DPO/GRPO trainers turn liger's fused CE off
  themselves (they compute log-probabilities with their own fused LM head), so there only the norms and the MLP are
  swapped.
- RoPE and liger's plain cross-entropy are not offered (`rope=True` or `cross_entropy=True` is an error, not
  silently ignored): they were not measured for Instella.
"""

import importlib.util
from types import MethodType

import torch
from torch.distributed.tensor import DTensor

import modeling_instella.modeling_instella as modeling

INSTELLA = "instella"
SHARDED_HEAD = (
    "use_liger_kernel: liger's fused linear cross-entropy reads lm_head.weight outside the head's forward, which "
    "under FSDP2 is a shard (not tested here): set liger_kernel_config: {fused_linear_cross_entropy: false} with FSDP"
)


def liger_installed() -> bool:
    """liger-kernel and Triton (which liger imports) are both importable."""
    return importlib.util.find_spec("liger_kernel") is not None and importlib.util.find_spec("triton") is not None


def register(monkey_patch=None) -> bool:
    """Add `apply_liger_kernel_to_instella` under "instella" to liger-kernel's table, the module
    `liger_kernel.transformers.monkey_patch` (given by `liger_hook` as it loads, else imported here; idempotent; an
    entry that liger itself ships one day is kept). False when liger-kernel cannot be imported here."""
    if monkey_patch is None:
        if not liger_installed():
            return False
        try:
            from liger_kernel.transformers import monkey_patch  # optional dependency, GPU machines only
        except ImportError:  # liger or Triton installed but broken (a version mismatch): the check says so on use
            return False
    monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN.setdefault(INSTELLA, apply_liger_kernel_to_instella)
    return True


def apply_liger_kernel_to_instella(
    rope: bool = False,
    cross_entropy: bool = False,
    fused_linear_cross_entropy: bool = True,
    rms_norm: bool = True,
    swiglu: bool = True,
    model=None,
) -> None:
    """liger-kernel's per-model patch for Instella (the signature of its `apply_liger_kernel_to_*`; the Trainer passes
    `liger_kernel_config` as keywords). On `model` (an `InstellaForCausalLM` or `InstellaModel`) in place, or with
    `model=None` on the classes of `modeling_instella` for models built afterwards. See the module docstring."""
    from liger_kernel.transformers.model.olmo2 import lce_forward  # optional dependency, GPU machines only

    if rope or cross_entropy:
        raise ValueError(
            "apply_liger_kernel_to_instella: rope and cross_entropy are not offered for Instella (not measured); "
            "use rms_norm, swiglu and fused_linear_cross_entropy"
        )
    if model is None:
        _patch_classes(modeling, rms_norm, swiglu, fused_linear_cross_entropy)
        return
    base = getattr(model, model.base_model_prefix, model)
    if rms_norm:
        for parent, name, norm in _norms(base):
            setattr(parent, name, _liger_norm(norm))
    if swiglu:
        for layer in base.layers:
            layer.mlp = _liger_mlp(layer.mlp, model.config)
    if fused_linear_cross_entropy and hasattr(model, "lm_head"):
        model.forward = MethodType(_fused_forward(lce_forward), model)


def _fused_forward(lce_forward):
    """liger's fused-CE forward, refusing a sharded (FSDP2 DTensor) head in one line rather than computing with it."""

    def forward(self, *args, **kwargs):
        if isinstance(self.lm_head.weight, DTensor):
            raise ValueError(SHARDED_HEAD)
        return lce_forward(self, *args, **kwargs)

    forward.__doc__ = lce_forward.__doc__
    return forward


def _norms(base):
    """(parent module, attribute, RMSNorm) of every RMSNorm of the decoder: final, per layer, q/k."""
    yield base, "norm", base.norm
    for layer in base.layers:
        yield layer, "pre_attention_layernorm", layer.pre_attention_layernorm
        yield layer, "pre_feedforward_layernorm", layer.pre_feedforward_layernorm
        yield layer.self_attn, "q_norm", layer.self_attn.q_norm
        yield layer.self_attn, "k_norm", layer.self_attn.k_norm


def _liger_norm(norm):
    """`LigerRMSNorm` in Llama's casting mode with `norm`'s eps and the same weight Parameter (no copy: optimizers,
    FSDP and LoRA's saved modules see the same tensor)."""
    from liger_kernel.transformers.rms_norm import LigerRMSNorm  # optional dependency, GPU machines only

    with torch.device("meta"):
        liger = LigerRMSNorm(norm.weight.shape[0], eps=norm.variance_epsilon, casting_mode="llama", in_place=False)
    liger.weight = norm.weight
    return liger


def _liger_mlp(mlp, config):
    """`LigerSwiGLUMLP` around `mlp`'s own gate/up/down projections (built on the meta device, then given them)."""
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP  # optional dependency, GPU machines only

    with torch.device("meta"):
        liger = LigerSwiGLUMLP(config)
    liger.gate_proj, liger.up_proj, liger.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
    return liger


def _patch_classes(module, rms_norm: bool, swiglu: bool, fused_linear_cross_entropy: bool) -> None:
    """liger's class-level form: the names `modeling_instella` builds its layers from, for models made later."""
    from liger_kernel.transformers.model.olmo2 import lce_forward  # optional dependency, GPU machines only
    from liger_kernel.transformers.rms_norm import LigerRMSNormForOlmo2  # casting_mode="llama", in_place=False
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    if rms_norm:
        module.InstellaRMSNorm = LigerRMSNormForOlmo2
    if swiglu:
        module.InstellaMLP = LigerSwiGLUMLP
    if fused_linear_cross_entropy:
        module.InstellaForCausalLM.forward = _fused_forward(lce_forward)
