"""Training throughput and MFU in the Trainer logs (a pretrain plugin:
`instella_recipes.pretraining.throughput:mfu_logging`).

Every log adds `perf/tokens_per_second` (all ranks, input tokens of training forwards since the previous log over
the wall time between the two logs), `perf/tokens_per_second_per_device` and `perf/mfu` = tokens/s x FLOPs per token
/ (peak x devices), FLOPs per token by SPEC.md 6 for the model's config at the observed sequence length, counting
active parameters only for MoE (instella_recipes/trainer/flops.py). `plugin_args`: `mfu_peak` = MI300X | H100 | H200
or a
number in FLOP/s (default: from the visible GPU's name; none on CPU, then only tokens/s is logged).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from instella_recipes.core import RecipeError
from instella_recipes.trainer.flops import PEAK_FLOPS, count_params, flops_per_token


def detect_peak() -> float | None:
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name().upper()
    for gpu, peak in PEAK_FLOPS.items():
        if gpu in name.replace(" ", ""):
            return peak
    return None


class ThroughputCallback(TrainerCallback):
    def __init__(self, model, peak: float | None):
        self.peak = peak
        self.config = model.config
        self.counts = count_params(model)  # before any wrapping/sharding: full shapes
        self.tokens = 0
        self.seq_len = 0
        self.start = None
        model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if module.training and ids is not None and torch.is_tensor(ids):
            self.tokens += ids.numel()
            self.seq_len = ids.shape[-1]

    def on_train_begin(self, args, state, control, **kwargs):
        self.start, self.tokens = time.perf_counter(), 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self.start is None:
            return
        now = time.perf_counter()
        tokens = torch.tensor([float(self.tokens)])
        world = 1
        if dist.is_available() and dist.is_initialized():
            world = dist.get_world_size()
            if dist.get_backend() == "nccl":
                tokens = tokens.cuda()
            dist.all_reduce(tokens)
        rate = tokens.item() / max(now - self.start, 1e-9)
        extra = {"perf/tokens_per_second": round(rate, 1), "perf/tokens_per_second_per_device": round(rate / world, 1)}
        if self.peak and self.seq_len:
            flops = flops_per_token(self.config, self.seq_len, self.counts)
            extra["perf/mfu"] = float(f"{rate * flops / (self.peak * world):.6g}")
        self.start, self.tokens = now, 0
        logs.update(extra)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)


def mfu_logging(model, plugin_args: dict) -> list[TrainerCallback]:
    """Plugin: tokens/s and MFU (active parameters) in the training logs. Args: `mfu_peak`."""
    peak = plugin_args.get("mfu_peak")
    if peak is None:
        peak = detect_peak()
    elif isinstance(peak, str):
        if peak not in PEAK_FLOPS:
            raise RecipeError(f"plugin_args.mfu_peak {peak!r}: choose {list(PEAK_FLOPS)} or a number in FLOP/s")
        peak = PEAK_FLOPS[peak]
    elif isinstance(peak, bool) or not isinstance(peak, (int, float)) or peak <= 0:
        raise RecipeError(f"plugin_args.mfu_peak must be a GPU name or a positive number, got {peak!r}")
    return [ThroughputCallback(model, float(peak) if peak else None)]
