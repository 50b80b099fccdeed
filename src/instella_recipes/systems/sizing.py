"""Sizing rules for a model on a cluster: parameters, FLOPs, GEMM shapes, vocab padding, memory per GPU, throughput.

Everything is computed from the transformers config (the model is built on the meta device for exact counts; see
instella_recipes/trainer/flops.py). The memory model, per GPU, with P parameters (total), W GPUs, G GPUs per node:

| strategy | weights | gradients | optimizer state |
|---|---|---|---|
| DDP | P x wb | P x gb | P x ob |
| ZeRO-1 (ZAYA1's data parallelism) | P x wb | P x gb | P x ob / W |
| FSDP full shard | P x wb / W + gathered | P x gb / W | P x ob / W |
| FSDP hybrid shard (shard in a node, replicate across) | P x wb / G + gathered | P x gb / G | P x ob / G |

wb / gb / ob = bytes per parameter of the master weights, gradients and optimizer state (defaults 4 / 4 / 8: fp32
master weights and gradients, AdamW's two fp32 moments; the bf16 compute copy is transient). "gathered" = the
unsharded bf16 parameters FSDP holds while computing: two decoder layers (the current one and the prefetched next).

LoRA (`lora_r` > 0): the P base weights are frozen at wb bytes each (2 for a bf16 base) with no gradients or
optimizer state; only the L adapter parameters (rank r on the named projections, PEFT's A: r x in and B: out x r)
train, in fp32: weights P x wb + L x 4, gradients L x gb, optimizer L x ob. The adapters' own activations (r wide)
are left out of the activation tally.

Activations (bf16, per GPU, no activation checkpointing, FlashAttention so no T x T scores), per token per layer:
input norm + normed input 2h, q/k/v (H + 2 KV) x Q, attention output H x Q, MLP norm + normed input 2h, and per
expert a token visits (top_k for MoE, 1 dense): gate, up and their product 3 I. Plus the logits, b T V x 9 bytes
(bf16 logits, the fp32 copy and the fp32 log-softmax transformers' loss keeps; `logit_bytes`, about 4 under TRL's
fused LM head). With activation checkpointing only each layer's input (h, the residual stream: fp32 with fp32 master
weights under autocast) is kept plus one layer's full set. With fp32 masters under bf16 autocast (DDP, ZeRO-1) the
bf16 copy of every weight (2P) is cached through the forward. The peak is the end of the forward, where gradients
exist only when accumulated over micro-steps (`accumulation` > 1). This is Korthikanti et al. (2022)'s tally adapted
to SwiGLU / GQA / MoE without dropout, with those three terms calibrated on the one-GPU peaks of GPU_BASELINE.md
(H200, 2026-11-28: 32K and 64K, the LoRA and full fine-tune recipes; tests/unit/systems/test_sizing.py, within 5%).

Long context (Instella-Long, `--long_context`): with Ulysses sequence parallelism of size SP (Jacobs et al. 2023,
"DeepSpeed Ulysses", arXiv:2309.14509) each GPU holds T / SP tokens of every activation outside attention, and inside
attention the all-to-all trades that for all T tokens of H / SP heads: the same bytes. So the activation tally above
is taken at b T / SP tokens per GPU (FlashAttention keeps no T x T scores; its O(T) softmax statistics are left out).
SP must divide T and the heads. Time per step at a target MFU: global tokens x FLOPs per token (6N + 12LHQT,
trainer/flops.py) / (GPUs x peak x MFU); the MFU counts model FLOPs only, so activation checkpointing's recompute (one
more forward, 8N instead of 6N) is part of what the target MFU absorbs; SP's all-to-all time likewise. Global tokens
per step are the authors' (INSTELLA_LONG_MATH.md 1.1): 64 x 64K (phase 1) and 32 unique x 256K (phase 2), on 8 nodes
x 8 GPUs; weights/gradients/AdamW FSDP full-shard over all of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from transformers import AutoConfig

import modeling_instella  # registers the instella model type with AutoConfig
from instella_recipes.core import (
    RecipeError,
    check_positive,
    check_range,
    exit_on_recipe_error,
    parse_recipe,
    setup_logging,
)
from instella_recipes.trainer.features.sequence_parallel import check_sequence_parallel
from instella_recipes.trainer.flops import (
    PEAK_FLOPS,
    ParamCounts,
    count_params_from_config,
    flops_per_token,
    human_count,
    moe_shape,
)
from instella_recipes.weights import build_meta_model

GPU_MEMORY_GB = {"MI300X": 192, "H100": 80, "H200": 141}
ALIGNMENTS = (64, 128, 256)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def preset(name: str):
    """The published configs as transformers configs."""
    presets = {
        "instella-3b": lambda: modeling_instella.InstellaConfig(),
        "amd-llama-135m": lambda: AutoConfig.for_model(
            "llama",
            vocab_size=32000,
            hidden_size=768,
            intermediate_size=2048,
            num_hidden_layers=12,
            num_attention_heads=12,
            num_key_value_heads=12,
            max_position_embeddings=2048,
            tie_word_embeddings=False,
        ),  # fmt: skip
        "zaya1-base": lambda: AutoConfig.for_model("zaya", max_position_embeddings=4096),
        "olmoe-1b-7b": lambda: AutoConfig.for_model(
            "olmoe",
            vocab_size=50304,
            hidden_size=2048,
            intermediate_size=1024,
            num_hidden_layers=16,
            num_attention_heads=16,
            num_key_value_heads=16,
            num_experts=64,
            num_experts_per_tok=8,
            max_position_embeddings=4096,
            tie_word_embeddings=False,
        ),  # fmt: skip
    }
    if name not in presets:
        raise RecipeError(f"unknown preset {name!r}: choose one of {sorted(presets)} or give a config.json / recipe")
    return presets[name]()


PRESETS = ("instella-3b", "amd-llama-135m", "zaya1-base", "olmoe-1b-7b")


def resolve_config(spec: str):
    """A preset name, an HF config.json (or the folder holding one), or a recipe YAML with `model_config` or
    `model_name_or_path`."""
    if spec in PRESETS:
        return preset(spec)
    path = Path(spec)
    if not path.exists():
        raise RecipeError(f"model {spec!r} is neither a preset ({', '.join(PRESETS)}) nor an existing file/folder")
    if path.suffix in (".yaml", ".yml"):
        recipe = yaml.safe_load(path.read_text()) or {}
        if isinstance(recipe.get("model_config"), dict):
            fields = dict(recipe["model_config"])
            try:
                return AutoConfig.for_model(fields.pop("model_type"), **fields)
            except (KeyError, ValueError) as err:
                raise RecipeError(f"{path}: model_config: {err}") from None
        if recipe.get("model_name_or_path"):
            return resolve_config(str(recipe["model_name_or_path"]))
        raise RecipeError(f"{path}: the recipe has neither model_config nor model_name_or_path")
    try:
        return AutoConfig.from_pretrained(str(path.parent if path.is_file() else path), trust_remote_code=True)
    except (OSError, ValueError) as err:
        raise RecipeError(f"{path}: not a model config: {err}") from None


def misaligned(value: int) -> list[int]:
    """The alignments in ALIGNMENTS that `value` is not a multiple of."""
    return [a for a in ALIGNMENTS if value % a]


def pad_to(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass
class Gemm:
    name: str
    m: int
    n: int
    k: int
    count: str = ""

    def flags(self) -> str:
        parts = []
        for label, value in (("M", self.m), ("N", self.n), ("K", self.k)):
            bad = misaligned(value)
            if bad:
                parts.append(f"{label}={value} not /{'/'.join(map(str, bad))}")
        return "; ".join(parts) or "ok"


def dims(config) -> dict:
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    num_experts, top_k = moe_shape(config)
    intermediate = getattr(config, "moe_intermediate_size", None) if num_experts else None
    intermediate = intermediate or config.intermediate_size
    return {
        "h": config.hidden_size,
        "layers": config.num_hidden_layers,
        "heads": heads,
        "kv_heads": getattr(config, "num_key_value_heads", None) or heads,
        "head_dim": head_dim,
        "intermediate": intermediate,
        "vocab": config.vocab_size,
        "experts": num_experts,
        "top_k": top_k,
    }


def gemm_shapes(config, tokens: int, seq_len: int) -> list[Gemm]:
    """The GEMMs of one decoder layer (+ lm_head) for `tokens` tokens per micro-batch, as (M, N, K) of
    Y[M, N] = X[M, K] W[K, N]. Attention's batched GEMMs are per (sequence, head)."""
    d = dims(config)
    h, q, kv = d["h"], d["heads"] * d["head_dim"], d["kv_heads"] * d["head_dim"]
    shapes = [
        Gemm("q_proj", tokens, q, h),
        Gemm("k_proj / v_proj", tokens, kv, h, "x2"),
        Gemm("attention QK^T", seq_len, seq_len, d["head_dim"], f"x{d['heads']} per sequence"),
        Gemm("attention PV", seq_len, d["head_dim"], seq_len, f"x{d['heads']} per sequence"),
        Gemm("o_proj", tokens, h, q),
    ]
    if d["experts"]:
        routed = max(1, tokens * d["top_k"] // d["experts"])  # tokens per expert under perfect balance
        shapes += [
            Gemm("router", tokens, d["experts"], h),
            Gemm("expert gate+up", routed, 2 * d["intermediate"], h, f"x{d['experts']} experts (balanced load)"),
            Gemm("expert down", routed, h, d["intermediate"], f"x{d['experts']} experts (balanced load)"),
        ]
    else:
        shapes += [
            Gemm("mlp gate / up", tokens, d["intermediate"], h, "x2"),
            Gemm("mlp down", tokens, h, d["intermediate"]),
        ]
    shapes.append(Gemm("lm_head", tokens, d["vocab"], h, "once per model"))
    return shapes


def vocab_advice(vocab: int, tokenizer_vocab: int | None = None) -> dict:
    """Rows to allocate: the tokenizer's ids padded to a multiple of 64 (MI300X/H100 GEMM tiles; ZAYA1's rule)."""
    base = tokenizer_vocab or vocab
    return {"tokenizer_vocab": base, "config_vocab": vocab, **{f"pad_{a}": pad_to(base, a) for a in ALIGNMENTS}}


@dataclass
class Cluster:
    nodes: int = 1
    gpus_per_node: int = 8
    micro_batch: int = 1
    seq_len: int = 4096
    weight_bytes: float = 4
    grad_bytes: float = 4
    optimizer_bytes: float = 8
    activation_checkpointing: bool = False
    lora_r: int = 0  # > 0: a frozen base plus rank-r adapters on `lora_targets`
    lora_targets: tuple[str, ...] = LORA_TARGETS
    sequence_parallel: int = 1  # Ulysses SP size: each GPU holds seq_len / sequence_parallel tokens of activations
    # bytes per token per vocabulary entry at the loss: transformers' ForCausalLMLoss keeps the bf16 logits, their
    # fp32 copy and the fp32 log-softmax (9, measured 9.1 on an H200); TRL's fused LM head (SFT/DPO) about 4
    logit_bytes: float = 9
    accumulation: int = 1  # micro-steps per optimizer step: with 1 the gradients (set_to_none) are not yet there

    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node


def lora_params(config, r: int, targets: tuple[str, ...] = LORA_TARGETS) -> int:
    """Parameters of rank-`r` LoRA adapters (PEFT's A: r x in, B: out x r) on every linear layer whose name ends in
    one of `targets`, counted on the model built on the meta device."""
    import torch

    model = build_meta_model(config)
    return sum(
        r * (module.in_features + module.out_features)
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )


def activation_bytes(config, cluster: Cluster) -> float:
    d = dims(config)
    experts_per_token = d["top_k"] if d["experts"] else 1
    per_token_layer = (
        4 * d["h"] + (d["heads"] + 2 * d["kv_heads"]) * d["head_dim"] + d["heads"] * d["head_dim"]
    ) + 3 * d["intermediate"] * experts_per_token
    tokens = cluster.micro_batch * cluster.seq_len / cluster.sequence_parallel  # per GPU under Ulysses SP
    logits = tokens * d["vocab"] * cluster.logit_bytes
    if cluster.activation_checkpointing:
        # each layer's input is the residual stream: fp32 with fp32 master weights under bf16 autocast
        residual = 4 if cluster.weight_bytes >= 4 else 2
        return tokens * (d["layers"] * d["h"] * residual + per_token_layer * 2) + logits
    return tokens * per_token_layer * d["layers"] * 2 + logits


def memory_per_gpu(config, counts: ParamCounts, cluster: Cluster) -> dict[str, dict[str, float]]:
    """GB per GPU for each strategy: weights, gradients, optimizer, activations, total."""
    p, world, node = counts.total, cluster.world, cluster.gpus_per_node
    layer_params = (p - counts.embedding * (1 if counts.tied_embeddings else 2)) / config.num_hidden_layers
    gathered = 2 * layer_params * 2  # two layers' bf16 parameters unsharded at a time
    activations = activation_bytes(config, cluster)
    wb, gb, ob = cluster.weight_bytes, cluster.grad_bytes, cluster.optimizer_bytes
    # what trains (t: all P, or the LoRA adapters) and what is stored as weights (the base, plus fp32 adapters)
    t = lora_params(config, cluster.lora_r, cluster.lora_targets) if cluster.lora_r else p
    stored = p * wb + (t * 4 if cluster.lora_r else 0)
    # fp32 masters under bf16 autocast (DDP, ZeRO-1): autocast caches the bf16 copy of every weight through the
    # forward; FSDP's mixed precision gathers bf16 layers instead ("gathered")
    cast = p * 2 if wb >= 4 else 0
    table = {
        "DDP": (stored, t * gb, t * ob, cast),
        "ZeRO-1": (stored, t * gb, t * ob / world, cast),
        "FSDP full shard": (stored / world + gathered, t * gb / world, t * ob / world, 0),
        "FSDP hybrid shard": (stored / node + gathered, t * gb / node, t * ob / node, 0),
    }
    out = {}
    for name, (weights, grads, optimizer, copies) in table.items():
        # the peak is the end of the forward: gradients are there only when accumulated over micro-steps (else they
        # are freed before it and grow in the backward while the activations are freed)
        held = activations + copies
        total = weights + optimizer + max(held + (grads if cluster.accumulation > 1 else 0), grads)
        out[name] = {
            "weights": weights / 1e9,
            "gradients": grads / 1e9,
            "optimizer": optimizer / 1e9,
            "activations": held / 1e9,
            "total": total / 1e9,
        }
    return out


def throughput(flops_token: float, target_mfu: float, world: int) -> dict[str, dict[str, float]]:
    return {
        gpu: {"per_gpu": target_mfu * peak / flops_token, "cluster": target_mfu * peak * world / flops_token}
        for gpu, peak in PEAK_FLOPS.items()
    }


def size(config, cluster: Cluster, target_mfu: float = 0.4, tokenizer_vocab: int | None = None) -> dict:
    """Every number the CLI prints, as a dict (the --json output)."""
    counts = count_params_from_config(config)
    flops = flops_per_token(config, cluster.seq_len, counts)
    tokens = cluster.micro_batch * cluster.seq_len
    return {
        "model_type": config.model_type,
        "params": counts.as_dict(),
        "trainable_params": lora_params(config, cluster.lora_r, cluster.lora_targets) if cluster.lora_r else None,
        "flops_per_token": flops,
        "seq_len": cluster.seq_len,
        "gemms": [{**g.__dict__, "flags": g.flags()} for g in gemm_shapes(config, tokens, cluster.seq_len)],
        "dims": {k: v for k, v in dims(config).items()},
        "vocab": vocab_advice(config.vocab_size, tokenizer_vocab),
        "cluster": {**cluster.__dict__, "lora_targets": list(cluster.lora_targets), "world": cluster.world},
        "memory_gb": memory_per_gpu(config, counts, cluster),
        "gpu_memory_gb": GPU_MEMORY_GB,
        "target_mfu": target_mfu,
        "tokens_per_second": throughput(flops, target_mfu, cluster.world),
    }


def render(report: dict) -> str:
    """The human-readable report (markdown tables)."""
    p = report["params"]
    c = report["cluster"]
    lines = [
        f"# {report['model_type']}: {p['total']:,} parameters ({human_count(p['total'])})",
        "",
        f"- active per token: {p['active']:,} ({human_count(p['active'])}); routed experts {p['routed_experts']:,}",
        f"- input embedding {p['embedding']:,}; tied lm_head: {p['tied_embeddings']}; non-embedding "
        f"{p['total'] - p['embedding']:,}",
        f"- FLOPs per token at T={report['seq_len']}: {report['flops_per_token']:.4g} "
        f"(6N + 12LHQT, N = {p['flops_params']:,} = active without the input embedding)",
        "",
        "## Dimensions (flag: not a multiple of 64 / 128 / 256)",
        "",
        "| dim | value | flag |",
        "|---|---|---|",
    ]
    for name, value in report["dims"].items():
        if value:
            bad = misaligned(value) if name not in ("layers", "heads", "kv_heads", "experts", "top_k") else []
            lines.append(f"| {name} | {value} | {'not /' + '/'.join(map(str, bad)) if bad else 'ok'} |")
    v = report["vocab"]
    lines += [
        "",
        f"Vocab: tokenizer {v['tokenizer_vocab']:,} -> pad to {v['pad_64']:,} (multiple of 64; 128: {v['pad_128']:,}, "
        f"256: {v['pad_256']:,}); config has {v['config_vocab']:,} rows.",
        "",
        f"## GEMMs per layer (M x N x K), micro-batch {c['micro_batch']} x {c['seq_len']} tokens",
        "",
        "| GEMM | M | N | K | count | alignment |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {g['name']} | {g['m']} | {g['n']} | {g['k']} | {g['count']} | {g['flags']} |" for g in report["gemms"]
    ]
    lines += [
        "",
        f"## Memory per GPU (GB), {c['nodes']} nodes x {c['gpus_per_node']} GPUs, micro-batch {c['micro_batch']} x "
        f"{c['seq_len']}, activation checkpointing {'on' if c['activation_checkpointing'] else 'off'}",
        "",
        "| strategy | weights | gradients | optimizer | activations | total | fits MI300X / H200 / H100 |",
        "|---|---|---|---|---|---|---|",
    ]
    if c["lora_r"]:
        lines[-2:-2] = [
            f"LoRA r {c['lora_r']} on {', '.join(c['lora_targets'])}: {report['trainable_params']:,} trainable "
            f"parameters (fp32); the base frozen at {c['weight_bytes']:g} bytes per parameter.",
            "",
        ]
    for name, m in report["memory_gb"].items():
        fits = " / ".join("yes" if m["total"] <= cap * 0.9 else "no" for cap in (192, 141, 80))
        lines.append(
            f"| {name} | {m['weights']:.1f} | {m['gradients']:.1f} | {m['optimizer']:.1f} | {m['activations']:.1f} | "
            f"{m['total']:.1f} | {fits} |"
        )
    lines += [
        "",
        f"## Throughput at {report['target_mfu']:.0%} MFU (dense bf16 peaks)",
        "",
        "| GPU | peak TFLOP/s | tokens/s per GPU | tokens/s cluster |",
        "|---|---|---|---|",
    ]
    for gpu, t in report["tokens_per_second"].items():
        lines.append(f"| {gpu} | {PEAK_FLOPS[gpu] / 1e12:.0f} | {t['per_gpu']:,.0f} | {t['cluster']:,.0f} |")
    return "\n".join(lines)


# --- long context (Instella-Long) ----------------------------------------------------------------------------------
LONG_CONTEXT_STEPS = {65536: 64, 262144: 32}  # unique sequences per optimizer step (INSTELLA_LONG_MATH.md 1.1)
LONG_CONTEXT_SP = (1, 2, 4, 8)
LONG_CONTEXT_GPUS = ("MI300X", "H100")


def step_seconds(flops_token: float, tokens_per_step: int, world: int, gpu: str, target_mfu: float) -> float:
    """Seconds per optimizer step at `target_mfu`: tokens x FLOPs per token / (world x peak x MFU)."""
    return tokens_per_step * flops_token / (world * PEAK_FLOPS[gpu] * target_mfu)


def check_sp_shape(config, seq_len: int, sp: int) -> None:
    """Ulysses splits the sequence into SP equal chunks and the heads into SP groups: the training stages' one rule
    (`check_sequence_parallel`), on a world of one SP group."""
    try:
        check_sequence_parallel(sp, seq_len, sp, config)
    except ValueError as err:
        raise RecipeError(str(err)) from None


def long_context_grid(
    config, cluster: Cluster, target_mfu: float = 0.4, steps: dict[int, int] | None = None
) -> list[dict]:
    """Memory (FSDP full shard, GB per GPU) and seconds per step for every (seq_len, SP, GPU) of the long-context
    table, with activation checkpointing on and off. `steps`: seq_len -> unique sequences per step."""
    counts = count_params_from_config(config)
    rows = []
    for seq_len, sequences in (steps or LONG_CONTEXT_STEPS).items():
        flops = flops_per_token(config, seq_len, counts)
        for sp in LONG_CONTEXT_SP:
            check_sp_shape(config, seq_len, sp)
            memory = {}
            for checkpointing in (True, False):
                shape = {**cluster.__dict__, "seq_len": seq_len, "micro_batch": 1}
                shape.update(sequence_parallel=sp, activation_checkpointing=checkpointing)
                memory[checkpointing] = memory_per_gpu(config, counts, Cluster(**shape))["FSDP full shard"]
            for gpu in LONG_CONTEXT_GPUS:
                rows.append(
                    {
                        "seq_len": seq_len,
                        "sequence_parallel": sp,
                        "gpu": gpu,
                        "memory_gb_checkpointing": memory[True]["total"],
                        "activations_gb_checkpointing": memory[True]["activations"],
                        "memory_gb_no_checkpointing": memory[False]["total"],
                        "fits_checkpointing": memory[True]["total"] <= GPU_MEMORY_GB[gpu] * 0.9,
                        "fits_no_checkpointing": memory[False]["total"] <= GPU_MEMORY_GB[gpu] * 0.9,
                        "sequences_per_step": sequences,
                        "seconds_per_step": step_seconds(flops, sequences * seq_len, cluster.world, gpu, target_mfu),
                    }
                )
    return rows


def render_long_context(rows: list[dict], cluster: Cluster, target_mfu: float) -> str:
    lines = [
        f"## Long context: FSDP full shard over {cluster.nodes} x {cluster.gpus_per_node} GPUs, micro-batch 1, "
        f"Ulysses SP, {target_mfu:.0%} MFU",
        "",
        "| seq_len | SP | GPU | GB/GPU (act. ckpt) | of which activations | GB/GPU (no ckpt) | fits (ckpt / no) | "
        "sequences/step | s/step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fits = f"{'yes' if r['fits_checkpointing'] else 'no'} / {'yes' if r['fits_no_checkpointing'] else 'no'}"
        lines.append(
            f"| {r['seq_len']:,} | {r['sequence_parallel']} | {r['gpu']} | {r['memory_gb_checkpointing']:.1f} | "
            f"{r['activations_gb_checkpointing']:.1f} | {r['memory_gb_no_checkpointing']:.1f} | {fits} | "
            f"{r['sequences_per_step']} | {r['seconds_per_step']:.1f} |"
        )
    return "\n".join(lines)


# --- the command (scripts/sizing.py) --------------------------------------------------------------------------------
@dataclass
class SizingArguments:
    """The settings of `scripts/sizing.py`."""

    model: str = field(default="instella-3b", metadata={"help": "preset, config.json / model folder, or recipe"})
    nodes: int = field(default=1, metadata={"help": "number of nodes"})
    gpus_per_node: int = field(default=8, metadata={"help": "GPUs per node (the hybrid-shard group)"})
    micro_batch: int = field(default=1, metadata={"help": "sequences per GPU per forward"})
    seq_len: int | None = field(
        default=None, metadata={"help": "tokens per sequence (T); default: the model's context length"}
    )
    target_mfu: float = field(default=0.4, metadata={"help": "MFU to turn into tokens/s"})
    tokenizer_vocab: int = field(default=None, metadata={"help": "tokenizer ids, for padding advice (e.g. 50280)"})
    weight_bytes: float = field(default=4, metadata={"help": "bytes per master weight (4 fp32, 2 bf16)"})
    grad_bytes: float = field(default=4, metadata={"help": "bytes per gradient"})
    optimizer_bytes: float = field(default=8, metadata={"help": "bytes of optimizer state per parameter (AdamW 8)"})
    activation_checkpointing: bool = field(default=False, metadata={"help": "keep only layer inputs"})
    lora_r: int = field(
        default=0, metadata={"help": "LoRA rank (0: full training); the base is frozen at weight_bytes"}
    )
    sequence_parallel: int = field(default=1, metadata={"help": "Ulysses SP size (divides seq_len and the heads)"})
    logit_bytes: float = field(
        default=9, metadata={"help": "bytes per token per vocab entry at the loss (9 transformers', 4 TRL SFT/DPO)"}
    )
    accumulation: int = field(default=1, metadata={"help": "micro-steps per optimizer step (>1: gradients held)"})
    long_context: bool = field(
        default=False,
        metadata={"help": "print the Instella-Long table instead: 64K / 256K x SP 1/2/4/8 x MI300X / H100"},
    )
    json: bool = field(default=False, metadata={"help": "print JSON instead of tables"})

    def __post_init__(self):
        check_positive(self, "nodes", "gpus_per_node", "micro_batch", "sequence_parallel", "accumulation")
        check_range("seq_len", self.seq_len, 1, integer=True, allow_none=True)
        check_range("lora_r", self.lora_r, 0, integer=True)
        check_range("tokenizer_vocab", self.tokenizer_vocab, 1, integer=True, allow_none=True)
        check_range("target_mfu", self.target_mfu, 0, 1, low_open=True)
        for name in ("weight_bytes", "grad_bytes", "optimizer_bytes", "logit_bytes"):
            check_range(name, getattr(self, name), 0)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> None:
    """`scripts/sizing.py`: print the sizing report (tables, or JSON with --json)."""
    (args,) = parse_recipe([SizingArguments], argv)
    setup_logging()
    config = resolve_config(args.model)
    seq_len = args.seq_len or getattr(config, "max_position_embeddings", None) or 4096  # the model's context
    cluster = Cluster(
        args.nodes, args.gpus_per_node, args.micro_batch, seq_len, args.weight_bytes, args.grad_bytes,
        args.optimizer_bytes, args.activation_checkpointing, args.lora_r, sequence_parallel=args.sequence_parallel,
        logit_bytes=args.logit_bytes, accumulation=args.accumulation,
    )  # fmt: skip
    if args.long_context:
        rows = long_context_grid(config, cluster, args.target_mfu)
        print(json.dumps(rows, indent=1) if args.json else render_long_context(rows, cluster, args.target_mfu))
        return
    check_sp_shape(config, seq_len, args.sequence_parallel)
    report = size(config, cluster, args.target_mfu, args.tokenizer_vocab)
    print(json.dumps(report, indent=1) if args.json else render(report))
