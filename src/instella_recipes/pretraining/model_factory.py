"""Build the model a pretraining recipe names: continue from a checkpoint, or a fresh one from `model_config`.

`model_config: {model_type: instella|llama|zaya|olmoe|..., <config fields>}` becomes `AutoConfig.for_model(...)`
and `AutoModelForCausalLM.from_config(...)`, so any causal LM transformers (or a registered remote-code class such
as Instella) knows can be pretrained with the same script. `init` picks the published initialisation.
"""

import math

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)
from instella_recipes.core import RecipeError
from instella_recipes.pretraining.initialization import init_mitchell
from instella_recipes.weights import check_model_folder, load_pretrained, looks_like_hub_id
from instella_recipes.weights.safetensors_io import check_model_finite


@torch.no_grad()
def init_amd_llama(model: nn.Module, generator: torch.Generator | None = None) -> nn.Module:
    """AMD-Llama-135m's initialisation (SPEC.md 4): normal with std sqrt(2/(5d)) for embeddings and linears; the
    output projections of each block (attention o_proj, MLP down_proj) std 1/sqrt(d)/n_layers; norms 1."""
    d = model.config.hidden_size
    n_layers = model.config.num_hidden_layers
    small = math.sqrt(2 / (5 * d))
    for name, module in model.named_modules():
        if isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, small, generator=generator)
        elif isinstance(module, nn.Linear):
            std = 1 / math.sqrt(d) / n_layers if name.endswith(("self_attn.o_proj", "mlp.down_proj")) else small
            module.weight.normal_(0.0, std, generator=generator)
            if module.bias is not None:
                module.bias.zero_()
        elif "RMSNorm" in type(module).__name__ or isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
    return model


INITS = {"mitchell": init_mitchell, "amd_llama": init_amd_llama, "default": None}


def build_model(
    model_name_or_path: str | None,
    model_config: dict | None,
    init: str | None,
    attn_implementation: str | None,
    dtype: str | None,
    seed: int,
):
    """The model to train (fp32 master weights unless `dtype` says otherwise; mixed precision is the Trainer's)."""
    torch_dtype = getattr(torch, dtype) if dtype not in (None, "auto") else None
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    if model_name_or_path:
        if model_config:
            raise RecipeError("give model_name_or_path (continue from a checkpoint) or model_config, not both")
        if not looks_like_hub_id(model_name_or_path):
            check_model_folder(model_name_or_path, "model_name_or_path")
        model = load_pretrained(
            AutoModelForCausalLM.from_pretrained, model_name_or_path, "model_name_or_path",
            dtype=torch_dtype or torch.float32, trust_remote_code=True, **kwargs,
        )  # fmt: skip
        check_model_finite(model, f"model_name_or_path {model_name_or_path}")
        return model
    if not model_config or "model_type" not in model_config:
        raise RecipeError("set model_name_or_path, or model_config with a model_type (instella, llama, zaya, olmoe)")
    fields = dict(model_config)
    model_type = fields.pop("model_type")
    try:
        config = AutoConfig.for_model(model_type, **fields)
    except (ValueError, TypeError, StrictDataclassError) as err:  # transformers' config validation
        raise RecipeError(f"model_config: {str(err).strip().splitlines()[-1]}") from None
    unknown = [k for k in fields if not hasattr(config, k)]
    if unknown:
        raise RecipeError(f"model_config: {model_type} configs have no field(s) {unknown}")
    if init is None:
        init = "mitchell" if model_type == "instella" else "default"
    if init not in INITS:
        raise RecipeError(f"init '{init}' unknown: choose one of {sorted(INITS)}")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype or torch.float32, **kwargs)
    if INITS[init] is not None:
        INITS[init](model, generator=torch.Generator().manual_seed(seed))
    return model
