"""One-command GPU suite (`make bench-gpu`): Instella-3B training-step throughput and MFU, peer models at the same
size, fused kernels, and speculative-decoding costs, written to `benchmarks/RESULTS.md`.

    python benchmarks/bench_gpu.py [--sections train peers liger speculative finetune] [--seq 4096] [--steps 5]
    python benchmarks/bench_gpu.py --smoke       # every code path at toy size on CPU, in seconds; records nothing

Sections (each row warmed up, then the median of `--steps` timed steps; the CUDA clock is synchronised):
- train: Instella-3B (the published config, random init) fwd + bwd + AdamW at seq 4096, fp32 master weights with
  bf16 autocast (what `Trainer(bf16=True)` runs), micro-batch 1, for every combination of attention (sdpa, and
  flash_attention_2 when flash-attn is installed) x torch.compile off/on x activation checkpointing off/on:
  tokens/s, MFU by SPEC.md 6 (6N + 12 L H Q T FLOPs per token over the device's dense bf16 peak) and peak memory;
  then the largest micro-batch that fits (doubling, then bisection; an out-of-memory step is caught);
- peers: `InstellaForCausalLM` vs transformers' `Olmo2ForCausalLM` and `LlamaForCausalLM` with the same sizes
  (Llama has no QK-norm, the only difference in parameters), as ratios;
- liger: Liger kernels (RMSNorm, SwiGLU, fused linear cross-entropy) through liger-kernel's own per-instance patch,
  the one `TrainingArguments(use_liger_kernel=True)` applies, vs plain: throughput ratio and peak-memory saving, for
  each model type liger-kernel has a patch for (skipped with the reason when it is not installed);
- speculative: an AMD-Llama-135m-shaped draft and a ~1.1B Llama target (TinyLlama's shape, CodeLlama's 32016
  vocab): each model's decode cost per token, the draft/target cost ratio c, the cost of checking k+1 tokens
  relative to one decoding step, the Leviathan et al. bound at the published acceptance (0.66, SPEC.md 4), and one
  assisted generate against plain greedy with the output compared token for token. The weights are random, so the
  acceptance measured there is not the method's (use benchmarks/bench_speculative.py for a trained pair);
- finetune: the one-GPU fine-tune recipes (recipes/instella-3b/finetune-{lora,full}-1gpu.yaml) as scripts/sft.py
  builds them (recipe -> TRL's SFTTrainer, every recipe key as written), on a random-init Instella-3B saved locally
  in bf16 (the Hub id is replaced: a GPU node may have no Hub access) with the OLMo tokenizer and synthetic chats
  longer than the recipe's max_length (every row truncated to it): the median optimizer step (all accumulation
  micro-batches) after warm-up steps, tokens/s, MFU and peak memory next to scripts/sizing.py's estimate;
- long: Instella-3B at long context on this one GPU (Instella-Long phase 1 without sequence parallelism): micro-batch
  1 at each of `--long_seqs` (default 32K and 64K) with activation checkpointing, flash_attention_2 when installed
  (sdpa otherwise): step time, tokens/s, MFU (6N + 12LHQT at that length) and peak memory next to scripts/sizing.py's
  estimate for one GPU (DDP column: fp32 weights, gradients, AdamW, activations by its tally); a length that does not
  fit reports OOM. `scripts/sizing.py --long_context true` has the multi-GPU / SP table this row anchors.
"""

import argparse
import gc
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Olmo2Config, Olmo2ForCausalLM

from instella_recipes.evaluation import speculative as spec
from instella_recipes.trainer import flops
from modeling_instella import InstellaConfig, InstellaForCausalLM

SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_parameters", "bos_token_id",
                "eos_token_id", "pad_token_id", "tie_word_embeddings")  # fmt: skip
SMOKE_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=512)
ARCHS = {"instella": (InstellaConfig, InstellaForCausalLM), "olmo2": (Olmo2Config, Olmo2ForCausalLM),
         "llama": (LlamaConfig, LlamaForCausalLM)}  # fmt: skip
# AMD-Llama-135m (SPEC.md 4) and a ~1.1B Llama (TinyLlama-1.1B's shape) with CodeLlama's padded 32016 vocab.
DRAFT_SHAPE = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
                   vocab_size=32000)  # fmt: skip
TARGET_SHAPE = dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                    num_key_value_heads=4, vocab_size=32016)  # fmt: skip
SMOKE_DRAFT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, vocab_size=256)
SMOKE_TARGET = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=272)
PUBLISHED_ACCEPTANCE = 0.66  # AMD-Llama-135m-code drafting for CodeLlama-7b on HumanEval (SPEC.md 4)
ROOT = Path(__file__).resolve().parents[1]
FINETUNE_RECIPES = {"lora": ROOT / "recipes/instella-3b/finetune-lora-1gpu.yaml",
                    "full": ROOT / "recipes/instella-3b/finetune-full-1gpu.yaml"}  # fmt: skip
GIB = 2**30 / 1e9  # sizing reports GB (1e9 bytes); the rows compare GiB with the measured peak
OLMO_TOKENIZER = ROOT / "tests/fixtures/tokenizers/olmo-gpt-neox-20b-pii-special.json"  # Instella's (SPEC.md 2.2)


# --- models ------------------------------------------------------------------------------------------------------
def config_for(arch: str, smoke: bool):
    """`arch`'s config with Instella-3B's published sizes (InstellaConfig defaults), or toy sizes for the smoke run;
    every shape field and token id copied, so the three models differ only in architecture."""
    reference = InstellaConfig(**(SMOKE_SHAPE if smoke else {}))
    config_cls, _ = ARCHS[arch]
    return config_cls(**{k: getattr(reference, k) for k in SHAPE_FIELDS})


def build(arch: str, config, attn: str, device) -> torch.nn.Module:
    """A random-init model with fp32 master weights, created directly on `device`."""
    config._attn_implementation = attn
    torch.manual_seed(0)
    with torch.device(device):
        return ARCHS[arch][1](config)


def free(device) -> None:
    """Give a finished row's GPU memory back before the next (a CPU smoke run has nothing to free, and a full
    `gc.collect` with transformers and dynamo loaded costs a second)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def peak_gib(device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None


def apply_liger(model) -> str | None:
    """Liger's kernels through transformers' own switch (`Trainer` runs exactly this when `use_liger_kernel=True`);
    None when applied, else why not (liger-kernel only patches the model types it knows)."""
    if importlib.util.find_spec("liger_kernel") is None:
        return "liger-kernel not installed (pip install -c constraints.txt '.[liger]'; needs a GPU and Triton)"
    if next(model.parameters()).device.type != "cuda":
        return "Liger's Triton kernels need a GPU"
    from liger_kernel.transformers import monkey_patch
    from transformers.integrations.liger import apply_liger_kernel

    if model.config.model_type not in getattr(monkey_patch, "MODEL_TYPE_TO_APPLY_LIGER_FN", {}):
        return f"liger-kernel has no patch for model_type {model.config.model_type!r}"
    apply_liger_kernel(model, None)
    return None


# --- one training configuration ----------------------------------------------------------------------------------
def make_step(model, device, batch: int, seq: int, amp: bool, documents=None) -> Callable[[], float]:
    """A closure running one fwd + bwd + AdamW step on random tokens; returns its wall seconds. `documents`: extra
    forward keywords that pack the row into documents (`document_inputs`)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
    ids = torch.randint(2, model.config.vocab_size, (batch, seq), device=device)
    documents = documents or {}

    def step() -> float:
        sync(device)
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = model(input_ids=ids, labels=ids, **documents).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync(device)
        return time.perf_counter() - start

    return step


def prepare(arch, config, attn, device, *, compile_backend=None, checkpointing=False, liger=False):
    """The model for one row, or (None, reason) when this row cannot run here."""
    model = build(arch, config, attn, device)
    model.train()
    if liger and (reason := apply_liger(model)):
        return None, reason
    if checkpointing:
        model.config.use_cache = False
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    if compile_backend:
        model.compile(backend=compile_backend)  # nn.Module.compile: compiles forward in place, keeps the class
    return model, None


def measure(model, device, batch, seq, steps, warmup, amp, flops_token, peak, documents=None) -> dict:
    """Median step time over `steps` after `warmup` steps; tokens/s, MFU, peak memory. OOM becomes a status."""
    free(device)
    try:
        step = make_step(model, device, batch, seq, amp, documents)
        first = [step() for _ in range(warmup)][:1]
        times = [step() for _ in range(steps)]
    except torch.OutOfMemoryError:
        return {"status": "OOM", "batch": batch}
    seconds = statistics.median(times)
    tokens_per_s = batch * seq / seconds
    return {
        "status": "ok", "batch": batch, "step_s": seconds, "step_s_min": min(times), "step_s_max": max(times),
        "tokens_per_s": tokens_per_s, "mfu": flops.mfu(tokens_per_s, flops_token, peak) if peak else None,
        "peak_gib": peak_gib(device), "first_step_s": first[0] if first else None,
    }  # fmt: skip


def largest_fitting(fits: Callable[[int], bool], cap: int) -> tuple[int, bool]:
    """The largest n <= cap with fits(n) (fits must be monotone): doubling from 1, then bisection between the last
    fit and the first miss. Returns (n, reached_cap); n = 0 when not even 1 fits."""
    low, high = 0, 1
    while high <= cap and fits(high):
        low, high = high, high * 2
    if high > cap:
        return low, True
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low, False


# --- sections ----------------------------------------------------------------------------------------------------
def long_rows(args, device, peak) -> list[dict]:
    """Instella-3B fwd + bwd + AdamW at each of `args.long_seqs` tokens, micro-batch 1, activation checkpointing, with
    the sizing model's one-GPU estimate beside the measured peak."""
    from instella_recipes.systems.sizing import Cluster, memory_per_gpu

    config = config_for("instella", args.smoke)
    counts = flops.count_params_from_config(config)
    attn = "flash_attention_2" if importlib.util.find_spec("flash_attn") and device.type == "cuda" else "sdpa"
    rows = []
    for seq in args.long_seqs:
        estimate = memory_per_gpu(config, counts, Cluster(gpus_per_node=1, seq_len=seq, activation_checkpointing=True))
        model, _ = prepare("instella", config, attn, device, checkpointing=True)
        flops_token = flops.flops_per_token(config, seq, counts)
        result = measure(model, device, 1, seq, args.steps, args.warmup, args.amp, flops_token, peak)
        rows.append({"seq": seq, "attn": attn, "sizing_gb": estimate["DDP"]["total"] / GIB, **result})
        print(json.dumps(rows[-1]), flush=True)
        del model
        free(device)
    return rows


def document_inputs(given: str, seq: int, documents: int, device) -> dict:
    """Forward keywords packing a row of `seq` tokens into `documents` equal documents: varlen boundaries
    (`cu_seq_lens_q/k`, what DataCollatorWithFlattening and the authors' doc_lens give; the model masks them for
    every attention implementation) or position_ids restarting per document (transformers' packed detection)."""
    length = seq // documents
    if given == "cu_seq_lens":
        bounds = torch.arange(0, seq + 1, length, device=device, dtype=torch.int32)
        return {"cu_seq_lens_q": bounds, "cu_seq_lens_k": bounds, "max_length_q": length, "max_length_k": length}
    return {"position_ids": torch.arange(length, device=device).repeat(documents)[None]}


def document_rows(args, device, peak) -> list[dict]:
    """Document-masked long rows (default 32K = 8 x 4K, micro-batch 1, activation checkpointing) for sdpa,
    flex_attention and flash_attention_2 (when installed), with the documents as `cu_seq_lens_q/k` (the recipes'
    path) and as position_ids restarts, against plain causal attention over the whole row (sdpa): step time and its
    ratio to the plain causal step. The target (issue 41): <= 0.7x plain causal with a block-sparse mask."""
    config = config_for("instella", args.smoke)
    seq = args.doc_seq
    flops_token = flops.flops_per_token(config, seq)
    attns = ["sdpa", "flex_attention"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    cases = [("sdpa", None)] + [(attn, given) for attn in attns for given in ("cu_seq_lens", "position_ids")]
    rows = []
    for attn, given in cases:
        if attn == "flex_attention" and device.type != "cuda":
            rows.append({"attn": attn, "documents": given, "seq": seq, "status": "flex_attention's backward needs a "
                         "GPU (its CPU forward: tests/unit/modeling/test_modeling_documents.py)"})  # fmt: skip
            continue
        model, _ = prepare("instella", config_for("instella", args.smoke), attn, device, checkpointing=True)
        documents = document_inputs(given, seq, args.doc_count, device) if given else None
        result = measure(model, device, 1, seq, args.steps, args.warmup, args.amp, flops_token, peak, documents)
        rows.append({"attn": attn, "documents": given or "none (plain causal)", "seq": seq, **result})
        print(json.dumps(rows[-1]), flush=True)
        del model
        free(device)
    if "flash_attention_2" not in attns:
        rows.append({"attn": "flash_attention_2", "documents": "-", "seq": seq,
                     "status": "flash-attn not installed (pip install '.[gpu]')"})  # fmt: skip
    return rows


def device_peak(device, override_tflops: float | None) -> float | None:
    """Dense bf16 peak FLOP/s of this device (SPEC.md 6), or None when unknown (MFU is then not reported)."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name()
    return next((value for key, value in flops.PEAK_FLOPS.items() if key in name), None)


def train_rows(args, device, peak) -> tuple[list[dict], dict]:
    """Attention x compile x checkpointing at micro-batch 1, then the largest micro-batch for the fastest setting
    and with checkpointing."""
    config = config_for("instella", args.smoke)
    counts = flops.count_params_from_config(config)
    flops_token = flops.flops_per_token(config, args.seq, counts)
    attns = ["sdpa"] + (["flash_attention_2"] if importlib.util.find_spec("flash_attn") else [])
    rows = []
    for attn in attns:
        for compiled, checkpointing in ((False, False), (False, True), (True, False), (True, True)):
            if args.smoke and compiled and checkpointing:
                continue  # the smoke run traces one compiled model (dynamo tracing is most of its time)
            setting = {"attn": attn, "compile": compiled, "checkpointing": checkpointing}
            model, why = prepare("instella", config_for("instella", args.smoke), attn, device,
                                 compile_backend=args.compile_backend if compiled else None,
                                 checkpointing=checkpointing)  # fmt: skip
            warmup = args.warmup + (2 if compiled and not args.smoke else 0)  # compiling happens in warm-up
            result = measure(model, device, 1, args.seq, args.steps, warmup, args.amp, flops_token, peak)
            rows.append({**setting, **result})
            print(json.dumps(rows[-1]), flush=True)
            del model
            free(device)
    if "flash_attention_2" not in attns:
        rows.append({"attn": "flash_attention_2", "status": "flash-attn not installed (pip install '.[gpu]')"})
    ok = [r for r in rows if r.get("status") == "ok" and not (args.smoke and r["compile"])]  # smoke: no recompiles
    best = max(ok, key=lambda r: r["tokens_per_s"])
    micro = {}
    for checkpointing in sorted({best["checkpointing"], True}):

        def fits(batch, checkpointing=checkpointing):  # without compile: one compilation per size would dominate
            model, _ = prepare("instella", config_for("instella", args.smoke), best["attn"], device,
                               checkpointing=checkpointing)  # fmt: skip
            result = measure(model, device, batch, args.seq, 1, 1, args.amp, flops_token, peak)
            del model
            free(device)
            print(f"micro-batch {batch}, checkpointing {checkpointing}: {result['status']}", flush=True)
            return result["status"] == "ok"

        micro[checkpointing] = largest_fitting(fits, args.max_micro_batch)
    info = {"params": counts.total, "flops_params": counts.flops_params, "flops_token": flops_token, "best": best,
            "micro": micro}  # fmt: skip
    return rows, info


def peer_rows(args, device, peak) -> list[dict]:
    """Instella, Olmo2 and Llama with the same sizes, sdpa, micro-batch 1, one after the other (three 3B models with
    AdamW state do not fit on one GPU together, so they cannot be interleaved step by step)."""
    rows = []
    for arch in ARCHS:
        config = config_for(arch, args.smoke)
        model, _ = prepare(arch, config, "sdpa", device)
        result = measure(model, device, 1, args.seq, args.steps, args.warmup, args.amp,
                         flops.flops_per_token(config, args.seq), peak)  # fmt: skip
        rows.append({"arch": arch, "params": sum(p.numel() for p in model.parameters()), **result})
        del model
        free(device)
    return rows


def liger_rows(args, device, peak) -> list[dict]:
    """Plain vs Liger for every architecture, micro-batch 1, sdpa; the ratio and the memory saving."""
    rows = []
    for arch in ARCHS:
        config = config_for(arch, args.smoke)
        flops_token = flops.flops_per_token(config, args.seq)
        row = {"arch": arch}
        for variant in ("plain", "liger"):
            model, why = prepare(arch, config_for(arch, args.smoke), "sdpa", device, liger=variant == "liger")
            if model is None:
                row["status"] = why
                free(device)  # the model built before the patch was refused
                break
            row[variant] = measure(model, device, 1, args.seq, args.steps, args.warmup, args.amp, flops_token, peak)
            del model
            free(device)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def decode_cost(model, ids, tokens: int) -> float:
    """Seconds per new token of plain greedy decoding (two lengths differenced, so the prefill cancels)."""
    device = ids.device

    def run(n):
        sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                           do_sample=False, pad_token_id=0, eos_token_id=None)  # fmt: skip
        sync(device)
        return time.perf_counter() - start

    run(2)
    return statistics.median((run(tokens + 1) - run(1)) / tokens for _ in range(3))


def verify_cost(model, ids, k: int) -> float:
    """Seconds of one forward over k+1 new tokens with the prompt in the KV cache / seconds of one over 1 token:
    how much a verification round costs relative to a decoding step (the bound assumes 1)."""
    device = ids.device
    with torch.inference_mode():
        cache = model(ids, use_cache=True).past_key_values

        def forward(n):
            sync(device)
            start = time.perf_counter()
            model(ids[:, -n:], past_key_values=cache, use_cache=True)
            sync(device)
            seconds = time.perf_counter() - start
            cache.crop(-n)  # back to the prompt (transformers 5: a negative crop removes that many tokens)
            return seconds

        forward(1), forward(k + 1)  # warm-up
        one = statistics.median(forward(1) for _ in range(5))
        many = statistics.median(forward(k + 1) for _ in range(5))
    return many / one


def speculative_rows(args, device) -> dict:
    """Costs of an AMD-Llama-135m-shaped draft against a ~1.1B target (bf16), the bound at the published
    acceptance, and one assisted generate compared with plain greedy token for token."""
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    models = {}
    for role, shape in (("draft", SMOKE_DRAFT if args.smoke else DRAFT_SHAPE),
                        ("target", SMOKE_TARGET if args.smoke else TARGET_SHAPE)):  # fmt: skip
        config = LlamaConfig(**shape, max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        torch.manual_seed(0 if role == "target" else 1)
        with torch.device(device):
            models[role] = LlamaForCausalLM(config).to(dtype).eval()
    target, draft = models["target"], models["draft"]
    spec.pad_draft_vocab(draft, target.config.vocab_size)
    ids = torch.randint(3, 256, (1, args.prompt_tokens), device=device)
    info = {"params": {r: sum(p.numel() for p in m.parameters()) for r, m in models.items()}, "dtype": str(dtype)}
    info["decode_s"] = {r: decode_cost(m, ids, args.new_tokens) for r, m in models.items()}
    info["c"] = info["decode_s"]["draft"] / info["decode_s"]["target"]
    info["verify"] = {k: verify_cost(target, ids, k) for k in args.draft_tokens}
    info["bound_published_a"] = {k: spec.speedup_bound(PUBLISHED_ACCEPTANCE, k, info["c"]) for k in args.draft_tokens}
    k = args.draft_tokens[0]
    spec.set_draft_length(draft, k)
    counts = spec.DraftCounts()
    kwargs = {"max_new_tokens": args.new_tokens, "do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    spec.count_drafts(target, spec.DraftCounts(), draft_loop=True)  # the warm-up: same generator, counts nothing
    spec.timed_generate(target, ids, kwargs, 0), spec.timed_generate(target, ids, kwargs, 0, draft=draft)
    spec.count_drafts(target, counts, draft_loop=True)  # our draft loop, as scripts/speculative.py runs by default
    plain, plain_s = spec.timed_generate(target, ids, kwargs, 0)
    assisted, assisted_s = spec.timed_generate(target, ids, kwargs, 0, draft=draft)
    info["assisted"] = {"k": k, "identical": bool(torch.equal(plain, assisted)), "acceptance": counts.acceptance_rate,
                        "speedup": plain_s / assisted_s}  # fmt: skip
    del models, target, draft
    free(device)
    return info


# --- the one-GPU fine-tune recipes ------------------------------------------------------------------------------
def finetune_inputs(workdir: Path, smoke: bool, max_length: int, rows: int) -> tuple[Path, Path]:
    """A random-init Instella (the published config; toy sizes with the real vocab for the smoke run) saved in bf16
    with the OLMo tokenizer, and `rows` synthetic chats of more than `max_length` tokens each."""
    from instella_recipes.data.tiny_world import TinyWorld
    from instella_recipes.data.tokenizer import load_tokenizer

    model_dir, data = workdir / "model", workdir / "chats.jsonl"
    config = InstellaConfig(**({**SMOKE_SHAPE, "vocab_size": 50304} if smoke else {}))
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and not smoke else "cpu"
    with torch.device(device):
        InstellaForCausalLM(config).to(torch.bfloat16).save_pretrained(model_dir)
    load_tokenizer(OLMO_TOKENIZER).save_pretrained(model_dir)
    free(torch.device(device))
    text = " ".join(row["text"] for row in TinyWorld().corpus())  # ~4 characters per token: 8 x max_length is ample
    answer = (text * (1 + 8 * max_length // len(text)))[: 8 * max_length]
    with data.open("w") as handle:
        for i in range(rows):
            messages = [{"role": "user", "content": f"Tell me everything you know, part {i}."},
                        {"role": "assistant", "content": answer}]  # fmt: skip
            handle.write(json.dumps({"messages": messages}) + "\n")
    return model_dir, data


def finetune_argv(recipe: Path, model_dir: Path, data: Path, out: Path, steps: int, smoke: bool) -> list[str]:
    """The recipe as written, with the local model and chats in place of the Hub ids; the smoke run makes it small."""
    argv = ["--config", str(recipe), "--model_name_or_path", str(model_dir), "--output_dir", str(out),
            "--sources", f"{{path: {data}, converter: messages}}", "--max_steps", str(steps), "--warmup_steps", "1",
            "--save_strategy", "no", "--report_to", "none", "--logging_steps", "1",
            "--dataset_num_proc", "1"]  # fmt: skip
    if smoke:
        argv += ["--bf16", "false", "--dtype", "float32", "--max_length", "32", "--per_device_train_batch_size", "2",
                 "--gradient_accumulation_steps", "1", "--global_batch_size", "2"]  # fmt: skip
    return argv


class StepClock:
    """A Trainer callback noting the wall clock (CUDA synchronised) at the end of every optimizer step."""

    def __init__(self, device):
        from transformers import TrainerCallback

        clock = self

        class _Callback(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                sync(device)
                clock.times.append(time.perf_counter())

        self.times: list[float] = []
        self.callback = _Callback()


def finetune_rows(args, device, peak) -> list[dict]:
    """Each one-GPU fine-tune recipe through SFT's own `build_trainer` (post_training/sft.py): median step seconds
    after the warm-up steps, tokens/s (rows are truncated to max_length, so a step is global batch x max_length
    tokens), MFU (6N + 12LHQT with N the whole model, as for full training; LoRA's backward skips the frozen weight
    gradients, so its MFU by this count overstates the work) and peak memory beside scripts/sizing.py's estimate."""
    import yaml

    from instella_recipes.core import parse_recipe
    from instella_recipes.post_training import sft
    from instella_recipes.post_training.shared import CheckedModelConfig
    from instella_recipes.systems.sizing import Cluster, memory_per_gpu

    rows = []
    steps = args.warmup + args.steps
    with tempfile.TemporaryDirectory(prefix="bench_finetune_") as tmp:
        recipes = {kind: yaml.safe_load(path.read_text()) for kind, path in FINETUNE_RECIPES.items()}
        max_length = 32 if args.smoke else max(r["max_length"] for r in recipes.values())
        batch = max(2 if args.smoke else r["global_batch_size"] for r in recipes.values())
        model_dir, data = finetune_inputs(Path(tmp), args.smoke, max_length, rows=steps * batch)
        for kind, path in FINETUNE_RECIPES.items():
            argv = finetune_argv(path, model_dir, data, Path(tmp) / kind, steps, args.smoke)
            training, model_args = parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], argv)
            free(device)
            trainer, _ = sft.build_trainer(training, model_args)  # the lifecycle API (trainer/stage.py)
            clock = StepClock(device)
            trainer.add_callback(clock.callback)
            trainer.train()
            timed = [b - a for a, b in zip(clock.times[args.warmup - 1 :], clock.times[args.warmup :])]
            seconds = statistics.median(timed)
            tokens = training.per_device_train_batch_size * training.gradient_accumulation_steps * training.max_length
            config = trainer.model.config
            cluster = Cluster(gpus_per_node=1, micro_batch=training.per_device_train_batch_size,
                              seq_len=training.max_length, activation_checkpointing=training.activation_checkpointing,
                              weight_bytes=2 if model_args.use_peft else 4,
                              lora_r=model_args.lora_r if model_args.use_peft else 0, logit_bytes=4,
                              accumulation=training.gradient_accumulation_steps)  # fmt: skip
            estimate = memory_per_gpu(config, flops.count_params_from_config(config), cluster)["DDP"]["total"] / GIB
            flops_token = flops.flops_per_token(config, training.max_length)
            rows.append({
                "recipe": path.relative_to(ROOT).as_posix(), "kind": kind, "status": "ok", "step_s": seconds,
                "step_s_min": min(timed), "step_s_max": max(timed), "tokens_per_step": tokens,
                "tokens_per_s": tokens / seconds,
                "mfu": flops.mfu(tokens / seconds, flops_token, peak) if peak else None,
                "peak_gib": peak_gib(device), "sizing_gb": estimate,
            })  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
            del trainer
            free(device)
    return rows


# --- report ------------------------------------------------------------------------------------------------------
def fmt(value, spec_: str = ".1f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec_)


def report(args, device, results) -> str:
    peak_tflops = fmt(results["peak"] and results["peak"] / 1e12, ".0f")
    out = [f"Device: {results['device']}; dense bf16 peak used for MFU: {peak_tflops} "
           f"TFLOP/s; seq {args.seq}, {args.steps} timed steps (median) after {args.warmup} warm-up steps (+2 with "
           "torch.compile); fp32 master weights, bf16 autocast; AdamW (fused on CUDA)."]  # fmt: skip
    if "train" in results:
        rows, info = results["train"]
        out += ["", f"### Instella-3B train step ({flops.human_count(info['params'])} parameters, "
                f"N = {info['flops_params']:,}, {info['flops_token']:.3e} FLOPs/token)", "",
                "| attention | compile | act. ckpt | step s (median [min, max]) | tokens/s | MFU | peak GiB |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            if r.get("status") != "ok":
                out.append(f"| {r['attn']} | {r.get('compile', '-')} | {r.get('checkpointing', '-')} | "
                           f"{r['status']} | | | |")  # fmt: skip
                continue
            out.append(f"| {r['attn']} | {r['compile']} | {r['checkpointing']} | {r['step_s']:.3f} "
                       f"[{r['step_s_min']:.3f}, {r['step_s_max']:.3f}] | {r['tokens_per_s']:,.0f} | "
                       f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}% | {fmt(r['peak_gib'], '.1f')} |")  # fmt: skip
        for r in rows:
            if r.get("compile") and r.get("status") == "ok":
                out.append(
                    f"\ntorch.compile ({r['attn']}, checkpointing {r['checkpointing']}): first step "
                    f"{fmt(r['first_step_s'], '.1f')} s (compilation) vs {r['step_s']:.3f} s per step after."
                )
        b = info["best"]
        for checkpointing, (n, capped) in info["micro"].items():
            out.append(f"\nLargest micro-batch at seq {args.seq} ({b['attn']}, without compile, activation "
                       f"checkpointing {checkpointing}): **{n}**" + (f" (search capped at {args.max_micro_batch})"
                                                                     if capped else ""))  # fmt: skip
    if "peers" in results:
        rows = results["peers"]
        base = next(r for r in rows if r["arch"] == "instella")
        out += ["", "### Same size, other architectures (sdpa, micro-batch 1)", "",
                "| model | parameters | tokens/s | MFU | tokens/s vs Instella |", "|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            if r.get("status", "ok") != "ok":
                out.append(f"| {r['arch']} | {r['params']:,} | {r['status']} | | |")
                continue
            ratio = r["tokens_per_s"] / base["tokens_per_s"]
            out.append(f"| {r['arch']} | {r['params']:,} | {r['tokens_per_s']:,.0f} | "
                       f"{fmt(r['mfu'] and 100 * r['mfu'], '.1f')}% | {ratio:.3f} |")  # fmt: skip
    if "liger" in results:
        out += ["", "### Liger kernels vs plain (sdpa, micro-batch 1)", "",
                "| model | plain tokens/s | Liger tokens/s | ratio | plain peak GiB | Liger peak GiB | memory saved |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in results["liger"]:
            if "status" in r:
                out.append(f"| {r['arch']} | {r['status']} | | | | | |")
                continue
            p, g = r["plain"], r["liger"]
            saved = (1 - g["peak_gib"] / p["peak_gib"]) * 100 if p.get("peak_gib") and g.get("peak_gib") else None
            out.append(f"| {r['arch']} | {p.get('tokens_per_s', 0):,.0f} | {g.get('tokens_per_s', 0):,.0f} | "
                       f"{g.get('tokens_per_s', 0) / p['tokens_per_s']:.3f} | {fmt(p.get('peak_gib'))} | "
                       f"{fmt(g.get('peak_gib'))} | {fmt(saved, '.0f')}% |")  # fmt: skip
    if "documents" in results:
        rows = results["documents"]
        base = next(r for r in rows if r["documents"].startswith("none") and r.get("status") == "ok")
        length = args.doc_seq // args.doc_count
        out += ["", f"### Packed documents: {args.doc_count} x {length:,} tokens in one row of {args.doc_seq:,} "
                "(micro-batch 1, activation checkpointing) vs plain causal sdpa", "",
                "| attention | documents given as | step s (median [min, max]) | vs plain causal | peak GiB |",
                "|---|---|---|---|---|"]  # fmt: skip
        for r in rows:
            if r.get("status") != "ok":
                out.append(f"| {r['attn']} | {r['documents']} | {r['status']} | | |")
                continue
            out.append(f"| {r['attn']} | {r['documents']} | {r['step_s']:.3f} [{r['step_s_min']:.3f}, "
                       f"{r['step_s_max']:.3f}] | {r['step_s'] / base['step_s']:.2f}x | "
                       f"{fmt(r['peak_gib'])} |")  # fmt: skip
    if "speculative" in results:
        s = results["speculative"]
        out += ["", f"### Speculative decoding costs: AMD-Llama-135m-shaped draft, ~1.1B Llama target ({s['dtype']}, "
                f"batch 1, {args.prompt_tokens}-token prompt)", "",
                f"Draft {flops.human_count(s['params']['draft'])} parameters: {s['decode_s']['draft'] * 1e3:.2f} "
                f"ms/token; target {flops.human_count(s['params']['target'])}: {s['decode_s']['target'] * 1e3:.2f} "
                "ms/token; "
                f"c = {s['c']:.3f}.", "",
                "| k | verify k+1 tokens / one step | bound at a = 0.66 (published) |", "|---|---|---|"]  # fmt: skip
        for k in args.draft_tokens:
            out.append(f"| {k} | {s['verify'][k]:.2f} | {s['bound_published_a'][k]:.2f}x |")
        a = s["assisted"]
        out.append(f"\nAssisted generate, k={a['k']}, random weights: greedy output identical to plain: "
                   f"{a['identical']}; acceptance {a['acceptance']:.2f} and speedup {a['speedup']:.2f}x are those of "
                   "an untrained pair (a floor, not the method's).")  # fmt: skip
    if "finetune" in results:
        out += ["", "### Fine-tune Instella on one GPU: the recipes as written (random-init weights, synthetic chats)",
                "",
                "| recipe | step s (median [min, max]) | tokens/step | tokens/s | MFU | peak GiB | sizing GiB |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in results["finetune"]:
            out.append(f"| `{r['recipe']}` | {r['step_s']:.3f} [{r['step_s_min']:.3f}, {r['step_s_max']:.3f}] | "
                       f"{r['tokens_per_step']:,} | {r['tokens_per_s']:,.0f} | {fmt(r['mfu'] and 100 * r['mfu'])}% | "
                       f"{fmt(r['peak_gib'])} | {r['sizing_gb']:.1f} |")  # fmt: skip
    if "long" in results:
        out += ["", "### Instella-3B at long context on one GPU (micro-batch 1, activation checkpointing, no SP)", "",
                "| seq | attention | step s (median [min, max]) | tokens/s | MFU | peak GiB | sizing GiB |",
                "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in results["long"]:
            if r["status"] != "ok":
                out.append(f"| {r['seq']:,} | {r['attn']} | {r['status']} | | | | {r['sizing_gb']:.1f} |")
                continue
            out.append(f"| {r['seq']:,} | {r['attn']} | {r['step_s']:.3f} [{r['step_s_min']:.3f}, "
                       f"{r['step_s_max']:.3f}] | {r['tokens_per_s']:,.0f} | {fmt(r['mfu'] and 100 * r['mfu'])}% | "
                       f"{fmt(r['peak_gib'])} | {r['sizing_gb']:.1f} |")  # fmt: skip
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sections = ["train", "peers", "liger", "documents", "speculative", "finetune", "long"]
    parser.add_argument("--sections", nargs="+", default=sections, choices=sections)
    parser.add_argument("--long_seqs", type=int, nargs="+", default=[32768, 65536], help="the long section's lengths")
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--doc_seq", type=int, default=32768, help="the documents section's row length")
    parser.add_argument("--doc_count", type=int, default=8, help="documents per row in the documents section")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--max_micro_batch", type=int, default=64)
    parser.add_argument("--compile_backend", default="inductor")
    parser.add_argument("--peak_tflops", type=float, default=None, help="dense bf16 peak if the device is not known")
    parser.add_argument("--prompt_tokens", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=64)
    parser.add_argument("--draft_tokens", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--output", default=None, help="also write the raw results as JSON here")
    parser.add_argument("--smoke", action="store_true", help="toy sizes on CPU, every code path, nothing recorded")
    args = parser.parse_args(argv)
    args.amp = True
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if args.smoke:  # toy sizes; compile through dynamo with the eager backend (no C++ toolchain, seconds)
        args.seq, args.steps, args.warmup, args.max_micro_batch, args.compile_backend = 32, 1, 1, 2, "eager"
        args.prompt_tokens, args.new_tokens, args.draft_tokens, args.long_seqs = 8, 4, [2], [64, 128]
        args.doc_seq, args.doc_count = 64, 4
    elif device.type != "cuda":
        sys.exit("bench_gpu needs a CUDA/ROCm GPU (torch.cuda.is_available() is False); `--smoke` runs on CPU")
    peak = device_peak(device, args.peak_tflops)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU (smoke)"
    results = {"device": name, "peak": peak, "args": {k: v for k, v in vars(args).items()}}
    runs = (("train", train_rows), ("peers", peer_rows), ("liger", liger_rows), ("documents", document_rows),
            ("long", long_rows))  # fmt: skip
    for section, run in runs:
        if section in args.sections:
            results[section] = run(args, device, peak)
    if "speculative" in args.sections:
        results["speculative"] = speculative_rows(args, device)
    if "finetune" in args.sections:
        results["finetune"] = finetune_rows(args, device, peak)
    body = report(args, device, results)
    print(body)
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=1, default=str))
    if not args.smoke:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, `benchmarks` is not on the path
        from benchmarks.results_io import record

        command = "make bench-gpu  # python benchmarks/bench_gpu.py " + " ".join(argv or sys.argv[1:])
        record("gpu", "GPU suite: Instella-3B training step, peers, Liger, speculative costs", body, command.strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
