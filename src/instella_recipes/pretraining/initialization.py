"""The Instella/OLMo "mitchell" initialisation for from-scratch pretraining (SPEC.md 1).

transformers' `_init_weights` draws every matrix from N(0, initializer_range); the published stage-1 run used
OLMo's fan-in scheme instead, so pretraining recipes call `init_mitchell(model)` once on a freshly built model.
"""

import math

import torch
from torch import nn


def _trunc_normal_(weight: torch.Tensor, std: float, generator: torch.Generator | None) -> None:
    nn.init.trunc_normal_(weight, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)


@torch.no_grad()
def init_mitchell(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """Re-initialise an Instella (or Llama-layout) causal LM in place and return it.

    Every linear: truncated normal at +-3 sigma with sigma = 1/sqrt(d_in); the attention output projection and the
    MLP down projection of layer l (0-based) are further divided by sqrt(2(l+1)). Embedding and lm_head:
    sigma = 1/sqrt(d_model). Norm weights: 1.
    """
    d_model = model.config.hidden_size
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            _trunc_normal_(module.weight, 1 / math.sqrt(d_model), generator)
        elif isinstance(module, nn.Linear):
            std = 1 / math.sqrt(module.in_features)
            if name.endswith(("self_attn.o_proj", "mlp.down_proj")):
                layer = int(name.split(".layers.")[1].split(".")[0])
                std /= math.sqrt(2 * (layer + 1))
            if name.endswith("lm_head"):
                std = 1 / math.sqrt(d_model)
            _trunc_normal_(module.weight, std, generator)
            if module.bias is not None:
                module.bias.zero_()
        elif "RMSNorm" in type(module).__name__ or isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
    return model
