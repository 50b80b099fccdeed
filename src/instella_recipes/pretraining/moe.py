"""Mixture-of-experts training plugins for `scripts/pretrain.py`: what transformers' ZAYA and OLMoE classes lack.

Each public plugin follows the pretrain contract `fn(model, plugin_args) -> list[TrainerCallback]` and is named in a
recipe as `plugins: ["instella_recipes.pretraining.moe:<name>"]`, configured through `plugin_args`:

- `expert_load_logging`: fraction of routed tokens per expert, per layer, added to the Trainer logs (and so to
  `trainer_state.json`'s `log_history`) every `logging_steps`: `moe/load_cv` (coefficient of variation of the
  per-expert load, mean over layers), `moe/max_over_min`, `moe/skip_fraction` (ZAYA's no-compute route) and, with
  `moe_log_per_expert: true` (default), `moe/l{layer}/e{expert}` fractions.
- `zaya_bias_controller`: ZAYA1's load balancing. `ZayaRouter` picks experts by `softmax(logits) + balancing_biases`
  where the biases are a non-trained buffer; transformers never updates them. After every optimizer step this
  nudges each expert's bias toward equal load (the auxiliary-loss-free rule of DeepSeek-V3, arXiv 2408.15664):
  `b_e += gain * sign(mean_load - load_e)` (or `* (mean_load - load_e) / mean_load` with
  `zaya_bias_update: proportional`), gain = `zaya_bias_gain`. The skip route's bias is left as the model has it.
  Counts are summed over data-parallel ranks first, so every rank applies the same update.
- `router_z_loss`: ST-MoE's router z-loss (arXiv 2202.08906), `coef * mean(logsumexp(router_logits)^2)`, which
  OLMoE trained with (coefficient 0.001) and transformers does not implement. Forward hooks collect each router's
  logits; a forward hook on the model adds the term to `outputs.loss`, so no Trainer change is needed.

Why hooks and callbacks rather than subclassing the model: the recipes load transformers' own classes, checkpoints
stay loadable by plain `from_pretrained`, and the same code serves any router whose output exposes logits/indices.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from instella_recipes.core import RecipeError

_MONITOR_ATTR = "_recipes_moe_load_monitor"


def _in_backward() -> bool:
    # Activation checkpointing re-runs router forwards inside backward; those must not be counted twice.
    # private: torch has no public "inside backward" query; torch.utils.checkpoint uses this one [test_private_apis]
    return torch._C._current_graph_task_id() != -1


def _router_kind(module) -> str | None:
    name = type(module).__name__
    if name == "ZayaRouter":
        return "zaya"
    if name.endswith("TopKRouter"):  # OlmoeTopKRouter, Qwen2MoeTopKRouter, MixtralTopKRouter ...
        return "topk"
    return None


def find_routers(model) -> list[tuple[str, torch.nn.Module, str]]:
    """(qualified name, module, kind) of every router, in layer order."""
    return [(name, module, kind) for name, module in model.named_modules() if (kind := _router_kind(module))]


class ExpertLoadMonitor:
    """Counts routed tokens per expert and layer with forward hooks on the routers (training forwards only).

    Two windows are kept: `step_counts` (since the last optimizer step, for the bias controller) and `log_counts`
    (since the last log, for logging). ZAYA has `num_experts + 1` classes, the last being the skip route."""

    def __init__(self, model):
        self.routers = find_routers(model)
        if not self.routers:
            raise RecipeError(
                f"{type(model).__name__} has no MoE router (ZayaRouter or *TopKRouter): the MoE plugins need "
                "model_config.model_type zaya or olmoe"
            )
        first = self.routers[0][1]
        self.num_experts = first.num_experts
        self.has_skip = self.routers[0][2] == "zaya"
        classes = self.num_experts + int(self.has_skip)
        self.step_counts = torch.zeros(len(self.routers), classes, dtype=torch.float64)
        self.log_counts = torch.zeros_like(self.step_counts)
        self.handles = [
            module.register_forward_hook(self._hook(index, kind))
            for index, (_, module, kind) in enumerate(self.routers)
        ]

    @classmethod
    def attach(cls, model) -> ExpertLoadMonitor:
        """One monitor per model, shared by all plugins."""
        monitor = getattr(model, _MONITOR_ATTR, None)
        if monitor is None:
            monitor = cls(model)
            setattr(model, _MONITOR_ATTR, monitor)
        return monitor

    def _hook(self, index: int, kind: str):
        def hook(module, args, output):
            if not module.training or _in_backward():
                return
            with torch.no_grad():
                if kind == "zaya":
                    # Recompute the routing decision exactly as ZayaRouter does, from its logits and biases: its
                    # returned indices have the skip route folded into expert 0 (with weight 0).
                    probs = torch.softmax(output[0], dim=-1).float() + module.balancing_biases
                    chosen = torch.topk(probs, module.top_k, dim=-1).indices
                else:
                    chosen = output[2]
                counts = torch.bincount(chosen.reshape(-1), minlength=self.step_counts.shape[1])
                counts = counts.to(device="cpu", dtype=torch.float64)
            self.step_counts[index] += counts
            self.log_counts[index] += counts

        return hook

    def take_step_counts(self) -> torch.Tensor:
        """The step window summed over data-parallel ranks, then reset."""
        counts = self.step_counts.clone()
        self.step_counts.zero_()
        return _all_reduce(counts, self.routers[0][1])

    def take_log_counts(self) -> torch.Tensor:
        counts = self.log_counts.clone()
        self.log_counts.zero_()
        return _all_reduce(counts, self.routers[0][1])

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _all_reduce(counts: torch.Tensor, module) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        device = next(module.parameters()).device
        if dist.get_backend() == "gloo":
            device = torch.device("cpu")
        reduced = counts.to(device)
        dist.all_reduce(reduced)
        return reduced.cpu()
    return counts


def load_fractions(counts: torch.Tensor, num_experts: int) -> torch.Tensor:
    """[layers, num_experts] fraction of the tokens sent to real experts that each expert received."""
    experts = counts[:, :num_experts]
    return experts / experts.sum(dim=1, keepdim=True).clamp_min(1)


def load_stats(counts: torch.Tensor, num_experts: int) -> dict[str, float]:
    """Balance summary of a [layers, classes] count matrix: mean over layers of the coefficient of variation and of
    max/min load (inf if an expert got nothing), plus the skip fraction where there is a skip route."""
    fractions = load_fractions(counts, num_experts)
    cv = (fractions.std(dim=1, unbiased=False) / fractions.mean(dim=1)).mean().item()
    minimum = fractions.min(dim=1).values
    ratio = (fractions.max(dim=1).values / minimum).mean().item() if bool((minimum > 0).all()) else math.inf
    stats = {"moe/load_cv": cv, "moe/max_over_min": ratio}
    if counts.shape[1] > num_experts:
        stats["moe/skip_fraction"] = (counts[:, num_experts:].sum() / counts.sum().clamp_min(1)).item()
    return stats


class ExpertLoadLoggingCallback(TrainerCallback):
    """Adds the per-layer expert loads of the last logging window to every Trainer log."""

    def __init__(self, monitor: ExpertLoadMonitor, per_expert: bool = True):
        self.monitor = monitor
        self.per_expert = per_expert

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs:  # only training logs; eval/final summaries keep their own keys
            return
        counts = self.monitor.take_log_counts()
        if counts.sum() == 0:
            return
        extra = {key: round(value, 6) for key, value in load_stats(counts, self.monitor.num_experts).items()}
        if self.per_expert:
            fractions = load_fractions(counts, self.monitor.num_experts)
            for layer, row in enumerate(fractions.tolist()):
                extra.update({f"moe/l{layer}/e{expert}": round(value, 6) for expert, value in enumerate(row)})
        logs.update(extra)
        # Trainer.log appends its copy to log_history before calling on_log: update that record too, so
        # trainer_state.json carries the loads.
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1].update(extra)


class ZayaBiasController(TrainerCallback):
    """After every optimizer step, moves each ZAYA expert's balancing bias toward equal load (see module doc)."""

    def __init__(self, monitor: ExpertLoadMonitor, gain: float, mode: str = "sign"):
        self.monitor = monitor
        self.gain = gain
        self.mode = mode
        # The routers, not their buffers: `model.to(device)` (the Trainer, FSDP) replaces buffer tensors.
        self.routers = [module for _, module, _ in monitor.routers]
        # fp32 masters: with a bf16 model the buffers are bf16, whose ulp near 0.1 (5e-4) would swallow small steps.
        # Made at the first update (after any checkpoint load) and re-read whenever the buffer was changed elsewhere.
        self.masters: list[torch.Tensor | None] = [None] * len(self.routers)

    def update(self, counts: torch.Tensor) -> None:
        num_experts = self.monitor.num_experts
        fractions = load_fractions(counts, num_experts)
        error = 1.0 / num_experts - fractions  # > 0: under-loaded, raise its bias
        step = torch.sign(error) if self.mode == "sign" else error * num_experts
        for layer, router in enumerate(self.routers):
            bias = router.balancing_biases
            if counts[layer, :num_experts].sum() == 0:
                continue
            master = self.masters[layer]
            if master is None or master.device != bias.device or not torch.equal(master.to(bias.dtype), bias):
                master = self.masters[layer] = bias.detach().float().clone()
            master[:num_experts] += (self.gain * step[layer]).to(master.device, master.dtype)
            with torch.no_grad():
                bias.copy_(master)

    def on_step_end(self, args, state, control, **kwargs):
        self.update(self.monitor.take_step_counts())


class RouterZLoss:
    """Adds `coef * mean_layers(mean_tokens(logsumexp(router_logits)^2))` to the model's training loss."""

    def __init__(self, model, coef: float):
        self.coef = coef
        self.logits: list[torch.Tensor] = []
        self.last_value: float | None = None
        routers = find_routers(model)
        if not routers:
            raise RecipeError(f"router_z_loss: {type(model).__name__} has no MoE router")
        self.handles = [module.register_forward_hook(self._collect) for _, module, _ in routers]
        self.handles.append(model.register_forward_pre_hook(self._reset))
        self.handles.append(model.register_forward_hook(self._add, with_kwargs=True))

    def _collect(self, module, args, output):
        if module.training and not _in_backward():
            self.logits.append(output[0])

    def _reset(self, module, args):
        self.logits = []

    def _add(self, module, args, kwargs, output):
        logits, self.logits = self.logits, []
        if not logits or getattr(output, "loss", None) is None:
            return output
        z_loss = torch.stack([torch.logsumexp(x.float(), dim=-1).pow(2).mean() for x in logits]).mean()
        self.last_value = z_loss.item()
        weight = 1.0
        # With loss kwargs the Trainer normalises the LM loss by the tokens of the whole accumulated batch and does
        # not divide by the accumulation steps: weight each micro-batch's z-loss by its token share to match.
        labels, total = kwargs.get("labels"), kwargs.get("num_items_in_batch")
        if labels is not None and total is not None:
            weight = (labels[..., 1:] != -100).sum() / total
        output.loss = output.loss + self.coef * weight * z_loss.to(output.loss.dtype)
        return output


class RouterZLossLoggingCallback(TrainerCallback):
    def __init__(self, z_loss: RouterZLoss):
        self.z_loss = z_loss

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None or "loss" not in logs or self.z_loss.last_value is None:
            return
        logs["moe/router_z_loss"] = round(self.z_loss.last_value, 6)
        if state.log_history and state.log_history[-1].get("step") == state.global_step:
            state.log_history[-1]["moe/router_z_loss"] = logs["moe/router_z_loss"]


def _number(plugin_args: dict, key: str, default: float, minimum: float = 0.0) -> float:
    value = plugin_args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < minimum:
        raise RecipeError(f"plugin_args.{key} must be a number >= {minimum}, got {value!r}")
    return float(value)


# ---- plugins (the pretrain contract) ----


def expert_load_logging(model, plugin_args: dict) -> list[TrainerCallback]:
    """Plugin: per-expert load fractions per layer in the training logs. Args: `moe_log_per_expert` (bool)."""
    per_expert = plugin_args.get("moe_log_per_expert", True)
    if not isinstance(per_expert, bool):
        raise RecipeError(f"plugin_args.moe_log_per_expert must be true or false, got {per_expert!r}")
    return [ExpertLoadLoggingCallback(ExpertLoadMonitor.attach(model), per_expert)]


def zaya_bias_controller(model, plugin_args: dict) -> list[TrainerCallback]:
    """Plugin: ZAYA balancing-bias controller. Args: `zaya_bias_gain` (default 1e-3), `zaya_bias_update`
    (`sign` | `proportional`)."""
    gain = _number(plugin_args, "zaya_bias_gain", 1e-3)
    mode = plugin_args.get("zaya_bias_update", "sign")
    if mode not in ("sign", "proportional"):
        raise RecipeError(f"plugin_args.zaya_bias_update must be 'sign' or 'proportional', got {mode!r}")
    monitor = ExpertLoadMonitor.attach(model)
    if not monitor.has_skip:
        raise RecipeError("zaya_bias_controller needs a ZAYA model (model_config.model_type: zaya)")
    return [ZayaBiasController(monitor, gain, mode)]


def router_z_loss(model, plugin_args: dict) -> list[TrainerCallback]:
    """Plugin: router z-loss. Args: `router_z_loss_coef` (default 0.001, OLMoE's value)."""
    coef = _number(plugin_args, "router_z_loss_coef", 1e-3)
    return [RouterZLossLoggingCallback(RouterZLoss(model, coef))]
