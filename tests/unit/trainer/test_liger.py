"""Liger for Instella (trainer/liger.py): registered in liger-kernel's own table once the library is imported, so
transformers' `apply_liger_kernel` (what the Trainer runs for `use_liger_kernel: true`) swaps every RMSNorm (q/k
norms included) and MLP for Liger's modules and the forward for the fused linear cross-entropy; Llama's casting mode
is Instella's RMSNorm; without a GPU `use_liger_kernel: true` is one line. liger's Triton kernels need a GPU: the
loss/gradient comparison with plain runs there and skips elsewhere."""

import inspect
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from instella_recipes.core.checks import LIGER_NEEDS, check_liger_kernel
from instella_recipes.core.errors import RecipeError
from instella_recipes.trainer import liger
from modeling_instella import InstellaForCausalLM
from modeling_instella.modeling_instella import InstellaRMSNorm
from tests.conftest import tiny_config

needs_liger = pytest.mark.skipif(not liger.liger_installed(), reason="liger-kernel (and Triton) not installed")


@needs_liger
def test_importing_the_library_registers_instella_in_liger_table():
    from liger_kernel.transformers import monkey_patch

    assert monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN["instella"] is liger.apply_liger_kernel_to_instella
    # transformers' switch goes through liger's lookup in that table, by the model's config.model_type
    from transformers.integrations import liger as hf_liger

    assert "_apply_liger_kernel_to_instance" in inspect.getsource(hf_liger.apply_liger_kernel)
    assert "MODEL_TYPE_TO_APPLY_LIGER_FN[model_type]" in inspect.getsource(
        monkey_patch._apply_liger_kernel_to_instance
    )


@needs_liger
def test_the_registration_waits_for_liger_so_importing_the_library_stays_light():
    """Every entry point imports `instella_recipes.trainer` first (stop requests, before `preflight`): that must not
    pull in liger, Triton, torch or the model; Instella is in liger's table as soon as liger's table module loads."""
    code = (
        "import sys, instella_recipes.trainer\n"
        "heavy = [m for m in ('torch', 'triton', 'liger_kernel', 'modeling_instella') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from transformers.integrations.liger import apply_liger_kernel\n"
        "from liger_kernel.transformers import monkey_patch\n"
        "from instella_recipes.trainer.liger import apply_liger_kernel_to_instella\n"
        "assert monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN['instella'] is apply_liger_kernel_to_instella\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


@needs_liger
def test_transformers_switch_swaps_every_norm_and_mlp_keeping_the_weights():
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    from transformers.integrations.liger import apply_liger_kernel

    torch.manual_seed(0)
    model = InstellaForCausalLM(tiny_config())
    params = dict(model.named_parameters())
    keys = list(model.state_dict())
    apply_liger_kernel(model, None)  # Trainer.__init__ with use_liger_kernel=True, liger_kernel_config=None
    norms = [m for m in model.modules() if isinstance(m, LigerRMSNorm)]
    assert len(norms) == 1 + 4 * model.config.num_hidden_layers  # final, pre-attn, pre-ffn, q_norm, k_norm
    assert not any(isinstance(m, InstellaRMSNorm) for m in model.modules())
    attn = model.model.layers[0].self_attn
    assert isinstance(attn.q_norm, LigerRMSNorm) and attn.q_norm.weight.shape == (64,)  # whole width
    assert all(n.casting_mode == "llama" and not n.in_place and n.offset == 0.0 for n in norms)
    assert all(n.variance_epsilon == model.config.rms_norm_eps for n in norms)
    assert all(isinstance(layer.mlp, LigerSwiGLUMLP) for layer in model.model.layers)
    assert list(model.state_dict()) == keys  # checkpoints load and save unchanged
    assert all(p is params[n] for n, p in model.named_parameters())  # the same Parameters, no copies
    assert model.forward.__func__ is not InstellaForCausalLM.forward  # the instance's: the fused-CE forward
    assert InstellaForCausalLM(tiny_config()).forward.__func__ is InstellaForCausalLM.forward  # the class untouched


@needs_liger
def test_rope_and_plain_cross_entropy_are_refused_not_ignored():
    with pytest.raises(ValueError, match="rope and cross_entropy are not offered"):
        liger.apply_liger_kernel_to_instella(rope=True, model=InstellaForCausalLM(tiny_config()))


def _liger_llama_mode(x, weight, eps):
    """liger's RMSNorm kernel in casting_mode "llama" (ops/rms_norm.py `_rms_norm_forward_kernel`), line for line:
    X to fp32, rstd = rsqrt(mean(X^2) + eps), X * rstd, cast to the input dtype, times the weight."""
    rows = x.to(torch.float32)
    rstd = torch.rsqrt((rows * rows).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return ((rows * rstd).to(x.dtype) * weight).to(x.dtype)


def _liger_gemma_mode(x, weight, eps):
    """The "gemma" mode: everything in fp32 (the weight too), cast at the end (OLMo-2's order)."""
    rows = x.to(torch.float32)
    rstd = torch.rsqrt((rows * rows).sum(-1, keepdim=True) / x.shape[-1] + eps)
    return (rows * rstd * weight.to(torch.float32)).to(x.dtype)


def test_llama_casting_mode_is_instellas_rmsnorm():
    """The mode the patch picks computes Instella's norm (fp32 normalise, cast, then the weight) bit for bit in bf16
    with bf16 weights; the other mode does not. The CPU proof of the formula; the GPU test runs the kernel."""
    torch.manual_seed(0)
    norm = InstellaRMSNorm(256, eps=1e-5).to(torch.bfloat16)
    norm.weight.data = torch.randn(256).to(torch.bfloat16)
    x = (torch.randn(64, 256) * 3).to(torch.bfloat16)
    expected = norm(x)
    assert torch.equal(_liger_llama_mode(x, norm.weight, 1e-5), expected)
    assert not torch.equal(_liger_gemma_mode(x, norm.weight, 1e-5), expected)


@needs_liger
def test_liger_kernel_source_still_has_the_llama_casting_order():
    """A canary for the transcription above: liger's kernel still casts before the weight in "llama" mode."""
    from liger_kernel.ops import rms_norm

    source = inspect.getsource(rms_norm)
    assert "# On Llama, only rstd is computed on fp32" in source
    assert "# On Llama, the multiplication with the weight is done on the original dtype" in source


def test_use_liger_kernel_without_a_gpu_is_one_line(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RecipeError) as err:
        check_liger_kernel(SimpleNamespace(use_liger_kernel=True))
    assert str(err.value) == LIGER_NEEDS and "\n" not in LIGER_NEEDS
    check_liger_kernel(SimpleNamespace(use_liger_kernel=False))  # off: nothing to check


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger's Triton kernels need a CUDA/ROCm GPU")
@needs_liger
def test_liger_loss_and_gradients_equal_plain_on_gpu():
    """fp32 weights, bf16 autocast (the recipes' mixed precision): the fused loss and every gradient within bf16
    rounding of plain Instella, with num_items_in_batch (the Trainer's summed-loss divisor) and without."""
    from transformers.integrations.liger import apply_liger_kernel

    results = []
    ids = torch.randint(2, 512, (2, 64), device="cuda")
    for patched in (False, True):
        torch.manual_seed(0)
        model = InstellaForCausalLM(tiny_config()).cuda().train()
        if patched:
            apply_liger_kernel(model, None)
        losses = []
        for kwargs in ({}, {"num_items_in_batch": torch.tensor(100, device="cuda")}):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids, **kwargs).loss
            loss.backward()
            losses.append(loss.detach().float())
        results.append((losses, {n: p.grad.float() for n, p in model.named_parameters()}))
    (plain_losses, plain_grads), (liger_losses, liger_grads) = results
    for a, b in zip(plain_losses, liger_losses):
        assert torch.allclose(a, b, rtol=1e-2), (a, b)
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, liger_grads[name], rtol=5e-2, atol=5e-3), name


@needs_liger
def test_class_level_patch_builds_liger_modules_for_later_models(monkeypatch):
    """liger's other form (`model=None`, before a model is built): the names modeling_instella builds from."""
    from liger_kernel.transformers.rms_norm import LigerRMSNorm
    from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

    import modeling_instella.modeling_instella as modeling

    for name in ("InstellaRMSNorm", "InstellaMLP"):  # restored after the test
        monkeypatch.setattr(modeling, name, getattr(modeling, name))
    monkeypatch.setattr(modeling.InstellaForCausalLM, "forward", modeling.InstellaForCausalLM.forward)
    liger.apply_liger_kernel_to_instella()
    model = modeling.InstellaForCausalLM(tiny_config())
    norms = [m for m in model.modules() if isinstance(m, LigerRMSNorm)]
    assert len(norms) == 1 + 4 * model.config.num_hidden_layers
    assert all(n.casting_mode == "llama" and not n.in_place for n in norms)
    assert all(isinstance(layer.mlp, LigerSwiGLUMLP) for layer in model.model.layers)


def test_a_recipe_with_use_liger_kernel_on_a_cpu_machine_is_refused_at_parse_time(monkeypatch):
    """Through the stage's own parser (what scripts/sft.py runs first): the recipe file named, before any work."""
    from instella_recipes.core import parse_recipe
    from instella_recipes.post_training.sft import CheckedSFTConfig
    from instella_recipes.post_training.shared import CheckedModelConfig

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    argv = ["--config", "recipes/tiny/sft.yaml", "--use_liger_kernel", "true"]
    with pytest.raises(RecipeError, match=r"^recipes/tiny/sft.yaml: use_liger_kernel: true needs the liger-kernel"):
        parse_recipe([CheckedSFTConfig, CheckedModelConfig], argv)
