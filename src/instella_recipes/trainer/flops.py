"""Parameter counts, FLOPs per token and MFU (SPEC.md 6), for dense and MoE models.

MFU = tokens/s x (6N + 12 L H Q T) / peak, where N is the parameter count that does matmul work per token: all
parameters except the input embedding (the lm_head counts, also when it is tied to the embedding, because its matmul
still runs), and for a mixture of experts only the routed experts that a token visits (routed expert parameters x
top_k / num_experts). L layers, H query heads, Q head_dim, T sequence length; no causal discount, recomputation not
counted. This is the convention of the PaLM paper / nanoGPT / OLMo-core, so numbers compare with theirs.

Counting is done on the real module tree built on the meta device (no memory), so it is exact for any
`AutoModelForCausalLM` without per-architecture formulas; `dense_param_count` is the analytic formula for
Llama/Instella-shaped models that the tests use as an independent check.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from instella_recipes.weights import build_meta_model

# Dense bf16 peak (no sparsity), TFLOP/s -> FLOP/s. Vendor data sheets: H100 SXM / H200 SXM 989.4, MI300X 1307.4.
PEAK_FLOPS = {"MI300X": 1307e12, "H100": 989e12, "H200": 989e12}


@dataclass(frozen=True)
class ParamCounts:
    """`total` counts every distinct parameter once (tied weights once). `active` is what one token uses:
    total with routed experts scaled by top_k / num_experts. `flops_params` is the N of the MFU formula."""

    total: int
    embedding: int
    routed_experts: int
    active: int
    flops_params: int
    tied_embeddings: bool

    def as_dict(self) -> dict:
        return asdict(self)


def _is_routed_expert(module) -> bool:
    # transformers stores routed experts as one module whose class name ends in "Experts" (OlmoeExperts,
    # ZayaExperts, MixtralExperts, Qwen3MoeExperts ...) with 3D [num_experts, ...] parameters. Shared experts are
    # separate MLP modules (named "shared_expert(s)") and count as dense.
    return type(module).__name__.endswith("Experts")


def moe_shape(config) -> tuple[int, int]:
    """(num_experts, top_k) for an MoE config, (0, 0) for a dense one."""
    num_experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0
    top_k = getattr(config, "num_experts_per_tok", None) or getattr(config, "top_k", None) or 0
    return int(num_experts), int(top_k)


def count_params(model) -> ParamCounts:
    """Exact counts from a built model (meta device is fine)."""
    seen: set[int] = set()
    total = routed = 0
    for module in model.modules():
        in_experts = _is_routed_expert(module)
        for param in module.parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += param.numel()
            routed += param.numel() if in_experts else 0
    embedding = model.get_input_embeddings().weight.numel()
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is model.get_input_embeddings().weight
    num_experts, top_k = moe_shape(model.config)
    active_routed = routed * top_k // num_experts if num_experts else routed
    active = total - routed + active_routed
    # The lm_head matmul runs even when its weight is the (excluded) input embedding.
    flops_params = active - embedding + (output.weight.numel() if tied else 0)
    return ParamCounts(total, embedding, routed, active, flops_params, tied)


def human_count(n: float) -> str:
    """A parameter count for a heading: 3.113B, 134.1M, 148.0K (never 0.000B for a toy model)."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.{3 if unit == 'B' else 1}f}{unit}"
    return f"{n:.0f}"


def count_params_from_config(config) -> ParamCounts:
    return count_params(build_meta_model(config))


def attention_dims(config) -> tuple[int, int, int]:
    """(layers, query heads, head_dim) of the attention term."""
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return config.num_hidden_layers, heads, head_dim


def flops_per_token(config, seq_len: int, counts: ParamCounts | None = None) -> float:
    """Training FLOPs per token, 6N + 12 L H Q T (forward + backward)."""
    counts = counts or count_params_from_config(config)
    layers, heads, head_dim = attention_dims(config)
    return 6 * counts.flops_params + 12 * layers * heads * head_dim * seq_len


def mfu(tokens_per_second: float, flops_token: float, peak: float | str, num_devices: int = 1) -> float:
    """Model FLOPs utilisation. `tokens_per_second` is the whole job's throughput over `num_devices` devices."""
    peak_flops = PEAK_FLOPS[peak] if isinstance(peak, str) else float(peak)
    return tokens_per_second * flops_token / (peak_flops * num_devices)


def tokens_per_second_at(target_mfu: float, flops_token: float, peak: float | str, num_devices: int = 1) -> float:
    """The throughput that `target_mfu` means: the inverse of `mfu`."""
    peak_flops = PEAK_FLOPS[peak] if isinstance(peak, str) else float(peak)
    return target_mfu * peak_flops * num_devices / flops_token


def dense_param_count(
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int | None = None,
    qk_norm: bool = False,
    tie_embeddings: bool = False,
) -> int:
    """Analytic count for a Llama-shaped decoder (SwiGLU, RMSNorm, no biases); `qk_norm` = Instella/OLMo-2's
    full-width q/k RMSNorm. Used to cross-check `count_params` independently of the module tree."""
    head_dim = head_dim or hidden_size // num_heads
    q, kv = num_heads * head_dim, num_kv_heads * head_dim
    attention = hidden_size * q + 2 * hidden_size * kv + q * hidden_size + ((q + kv) if qk_norm else 0)
    layer = attention + 3 * hidden_size * intermediate_size + 2 * hidden_size
    embeddings = vocab_size * hidden_size * (1 if tie_embeddings else 2)
    return num_layers * layer + embeddings + hidden_size
