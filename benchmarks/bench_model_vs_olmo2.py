"""InstellaForCausalLM vs transformers' Olmo2ForCausalLM, side by side in one run.

Same sizes, same attention backend, same dtype; Olmo2 has the same QK-norm and op count (it differs only in where
the block norms sit). Timed, interleaved (A, B, A, B, ...) so machine noise hits both alike:
- a training step: forward + backward + AdamW step;
- greedy decoding with the KV cache.
Reports median times and the ratio olmo2 / instella (>= 1.00 means ours is at least as fast).

    python benchmarks/bench_model_vs_olmo2.py                       # CPU default size
    python benchmarks/bench_model_vs_olmo2.py --preset 3b --seq 4096 --batch 1 --dtype bfloat16   # on a GPU
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import Olmo2Config, Olmo2ForCausalLM

try:  # run as a file (`python benchmarks/bench_model_vs_olmo2.py`), the repository root is not on the path
    from benchmarks.results_io import record
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.results_io import record
from modeling_instella import InstellaConfig, InstellaForCausalLM

PRESETS = {
    "cpu": dict(hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8, vocab_size=4096),
    "3b": dict(),  # the published Instella-3B config (InstellaConfig defaults)
}


def build(kind: str, preset: str, attn: str, dtype, device):
    # Both configs get every field explicitly (shape, norms, token ids): a different eos/pad would change which
    # logits processors generate() runs and so the decode timing.
    reference = InstellaConfig(**PRESETS[preset])
    fields = {
        k: getattr(reference, k)
        for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                  "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "rope_parameters",
                  "bos_token_id", "eos_token_id", "pad_token_id", "tie_word_embeddings")
    }  # fmt: skip
    config = InstellaConfig(**fields) if kind == "instella" else Olmo2Config(**fields)
    config._attn_implementation = attn
    cls = InstellaForCausalLM if kind == "instella" else Olmo2ForCausalLM
    torch.manual_seed(0)
    return cls(config).to(device=device, dtype=dtype)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def train_step(model, optimizer, ids, device):
    sync(device)
    start = time.perf_counter()
    loss = model(ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync(device)
    return time.perf_counter() - start


@torch.no_grad()
def decode(model, prompt, new_tokens, device):
    sync(device)
    start = time.perf_counter()
    model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=1)
    sync(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS), default="cpu")
    parser.add_argument("--attn", default="sdpa")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--no_record", action="store_true", help="print only; do not write benchmarks/results")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)

    models = {kind: build(kind, args.preset, args.attn, dtype, device) for kind in ("instella", "olmo2")}
    n_params = sum(p.numel() for p in models["instella"].parameters())
    assert n_params == sum(p.numel() for p in models["olmo2"].parameters())
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
    vocab = models["instella"].config.vocab_size
    ids = torch.randint(2, vocab, (args.batch, args.seq), device=device)
    prompt = ids[:1, : min(64, args.seq)]

    times = {(k, w): [] for k in models for w in ("train", "decode")}
    for k, m in models.items():  # warm-up: allocator, kernels, first-call overheads
        m.train()
        train_step(m, optimizers[k], ids, device)
        m.eval()
        decode(m, prompt, 4, device)
    for _ in range(args.repeats):
        for k, m in models.items():
            m.train()
            times[(k, "train")].append(train_step(m, optimizers[k], ids, device))
        for k, m in models.items():
            m.eval()
            times[(k, "decode")].append(decode(m, prompt, args.new_tokens, device))

    med = {key: statistics.median(v) for key, v in times.items()}
    train_tokens = args.batch * args.seq
    rows = [
        "| workload | Instella (median) | Olmo2 (median) | ratio Olmo2/Instella |",
        "|---|---|---|---|",
        f"| train step (fwd+bwd+AdamW), {args.batch}x{args.seq} tokens | {med[('instella', 'train')] * 1e3:.1f} ms "
        f"({train_tokens / med[('instella', 'train')]:,.0f} tok/s) | {med[('olmo2', 'train')] * 1e3:.1f} ms "
        f"({train_tokens / med[('olmo2', 'train')]:,.0f} tok/s) | "
        f"{med[('olmo2', 'train')] / med[('instella', 'train')]:.3f} |",
        f"| greedy decode, {args.new_tokens} new tokens, batch 1 | {med[('instella', 'decode')] * 1e3:.1f} ms | "
        f"{med[('olmo2', 'decode')] * 1e3:.1f} ms | {med[('olmo2', 'decode')] / med[('instella', 'decode')]:.3f} |",
    ]
    body = (
        f"Preset `{args.preset}` ({n_params / 1e6:.1f}M parameters), attention `{args.attn}`, dtype {args.dtype}, "
        f"{args.repeats} interleaved repeats after one warm-up each.\n\n" + "\n".join(rows)
    )
    print(body)
    if not args.no_record:
        record(f"model_vs_olmo2_{args.preset}", "Model: InstellaForCausalLM vs Olmo2ForCausalLM", body)


if __name__ == "__main__":
    main()
