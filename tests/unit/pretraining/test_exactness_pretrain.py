"""Exact to the authors' training code (SPEC.md 2.1), through the real `scripts/pretrain.py` entry point:

- the LR the optimizer applies in update k is the authors' formula at *their* index: OLMo/Instella's `get_lr(k)`
  (`instella/optim.py`, step counter incremented before the LR is set), lit_gpt's `get_lr(k * A - 1)` over
  micro-iterations (`pretrain/tinyllama.py`, A = gradient accumulation of the authors' run);
- stage 2 continues stage 1's AdamW state: its first update equals the AdamW update computed by hand from the
  moments stage 1 saved;
- the loss normaliser: OLMo divides the summed token cross-entropy by the batch's input tokens, B x seq_len
  (`instella/train.py:656-658,707`); lit_gpt (AMD-Llama-135m) reads blocks of block_size + 1 tokens and takes the
  mean cross-entropy over all block_size predictions (`pretrain/tinyllama.py:244-249`, `:374`).

The reference formulas below are transcribed from the authors' code, not imported from ours. The LR and the
gradients are read inside each update by a `plugins:` callback (the user feature stays covered).
"""

import importlib
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import TrainerCallback

from instella_recipes.core import parse_recipe
from instella_recipes.pretraining.pretrain import PretrainArguments, main
from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv

RECIPES = Path(__file__).resolve().parents[3] / "recipes"

pytestmark = pytest.mark.usefixtures("one_thread")
PLUGIN_MODULE = "tests.unit.pretraining.test_exactness_pretrain"
PLUGIN = ["--plugins", f"{PLUGIN_MODULE}:record_updates"]
UPDATES: list[dict] = []


def _updates() -> list[dict]:
    """The plugin's records (pytest imports this file under another module name than the plugin path)."""
    return importlib.import_module(PLUGIN_MODULE).UPDATES


class _Recorder(TrainerCallback):
    def __init__(self, model, keep_tensors: bool, keep_inputs: bool = False):
        self.model, self.keep_tensors, self.current = model, keep_tensors, {}
        self.inputs = []
        if keep_inputs:  # what each forward of the first update receives
            model.register_forward_pre_hook(self._record_inputs, with_kwargs=True)

    def _record_inputs(self, module, args, kwargs):
        if not UPDATES:
            self.inputs.append({k: kwargs[k].detach().clone() for k in ("input_ids", "shift_labels") if k in kwargs})

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.keep_tensors and not UPDATES:  # the first update only: gradients (after clipping) and weights
            self.current = {
                "grads": {n: p.grad.detach().clone() for n, p in self.model.named_parameters()},
                "before": {n: p.detach().clone() for n, p in self.model.named_parameters()},
            }

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        record = {"lr": optimizer.param_groups[0]["lr"], **self.current}
        if self.inputs and not UPDATES:
            record["inputs"] = self.inputs
        if self.current:
            record["after"] = {n: p.detach().clone() for n, p in self.model.named_parameters()}
        self.current = {}
        UPDATES.append(record)


def record_updates(model, plugin_args):
    """The plugin: record the LR applied in every update (and the first update's tensors when asked)."""
    UPDATES.clear()
    return [_Recorder(model, bool(plugin_args.get("tensors")), bool(plugin_args.get("inputs")))]


# --- the authors' formulas, transcribed ---------------------------------------------------------------------------
def olmo_get_lr(initial_lr, step, max_steps, *, kind, warmup_steps, alpha_f, warmup_min_lr=None):
    """instella/optim.py: CosWithWarmup / LinearWithWarmup.get_lr with Scheduler._linear_warmup."""
    eta_min = initial_lr * alpha_f
    if step < warmup_steps:
        warmup_min_lr = warmup_min_lr if warmup_min_lr is not None else initial_lr * 0.10
        return warmup_min_lr + (initial_lr - warmup_min_lr) * min(step, warmup_steps) / warmup_steps
    if step >= max_steps:
        return eta_min
    step, max_steps = step - warmup_steps, max_steps - warmup_steps
    if kind == "cosine":
        return eta_min + (initial_lr - eta_min) * (1 + math.cos(math.pi * step / max_steps)) / 2
    return initial_lr - (initial_lr - eta_min) * (step / max_steps)


def lit_gpt_get_lr(it, *, learning_rate, min_lr, warmup_iters, lr_decay_iters):
    """AMD-LLM pretrain/tinyllama.py get_lr(it), `it` the 0-based micro-iteration."""
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    if it > lr_decay_iters:
        return min_lr
    decay_ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


def _applied_lrs(data_dir, out, max_steps, **overrides):
    assert main(pretrain_argv(data_dir, out, max_steps=max_steps, save_steps=100, **overrides) + PLUGIN) == 0
    assert len(_updates()) == max_steps
    return [u["lr"] for u in _updates()]


@pytest.mark.parametrize(
    "kind, warmup, alpha_f",
    [("cosine", 3, 0.1), ("linear", 0, 0.0), ("linear", 2, 0.001)],
    ids=["stage1-cosine-warmup", "stage2-linear-to-0", "sft-linear-alpha_f"],
)
def test_olmo_schedules_apply_lr_k_in_update_k(data_dir, tmp_path, kind, warmup, alpha_f):
    kwargs = f'{{"alpha_f": {alpha_f}}}'
    lrs = _applied_lrs(
        data_dir, tmp_path / "run", 6, lr_scheduler_type=kind, warmup_steps=warmup, lr_scheduler_kwargs=kwargs
    )
    expected = [olmo_get_lr(3e-3, k, 6, kind=kind, warmup_steps=warmup, alpha_f=alpha_f) for k in range(1, 7)]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=0.0)
    if alpha_f == 0.0:
        assert lrs[-1] == 0.0  # the last stage-2 update runs at exactly 0, as the authors'


def test_first_stage1_update_runs_at_4_018e_5():
    # the published stage-1 schedule: 4e-4 peak, warmup 2000 from 10%; update 1 uses lr(1)
    from instella_recipes.trainer.features.optimizer import olmo_scheduler

    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=4e-4)
    olmo_scheduler(opt, warmup_steps=2000, total_steps=969_000, decay="cosine", alpha_f=0.1)
    assert opt.param_groups[0]["lr"] == pytest.approx(4.018e-5, rel=1e-12)


@pytest.mark.parametrize("accumulation", [1, 2], ids=["pretrain-A1", "code-finetune-A2"])
def test_lit_gpt_schedule_matches_its_micro_iteration_indexing(data_dir, tmp_path, accumulation):
    # AMD-Llama-135m: warmup from 0, cosine to 0.1 x peak; lr_step_offset = 1 - 1/A of the authors' run
    offset = 1 - 1 / accumulation
    kwargs = f'{{"alpha_f": 0.1, "warmup_start_factor": 0.0, "lr_step_offset": {offset}}}'
    lrs = _applied_lrs(
        data_dir, tmp_path / "run", 6, lr_scheduler_type="cosine", warmup_steps=2, lr_scheduler_kwargs=kwargs
    )
    a = accumulation
    expected = [
        lit_gpt_get_lr(k * a - 1, learning_rate=3e-3, min_lr=3e-4, warmup_iters=2 * a, lr_decay_iters=6 * a)
        for k in range(1, 7)
    ]
    assert lrs == pytest.approx(expected, rel=1e-9, abs=1e-15)


def test_bad_schedule_kwargs_are_refused_before_work(data_dir, tmp_path, capsys):
    argv = pretrain_argv(data_dir, tmp_path / "bad", lr_scheduler_kwargs='{"alpha_f": 0.1, "lr_step_ofset": 1}')
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "lr_step_ofset" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()


def _without_model_config(argv: list[str]) -> list[str]:
    i = argv.index("--model_config")
    return argv[:i] + argv[i + 2 :]


def _adamw_by_hand(p, g, m, v, step, *, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.AdamW (the authors' optimizer, decoupled weight decay) from the saved state, one update."""
    step = step + 1
    m = beta1 * m + (1 - beta1) * g
    v = beta2 * v + (1 - beta2) * g * g
    p = p * (1 - lr * weight_decay)
    denom = (v.sqrt() / math.sqrt(1 - beta2**step)) + eps
    return p - (lr / (1 - beta1**step)) * m / denom


def test_stage2_continues_stage1_adamw_moments(data_dir, tmp_path):
    stage1 = tmp_path / "stage1"
    assert main(pretrain_argv(data_dir, stage1, max_steps=4, save_steps=100, save_optimizer_state="true")) == 0
    saved = tmp_path / "optimizer.pt"
    dcp_to_torch_save(stage1 / "optimizer_state", saved)
    state = torch.load(saved, weights_only=False)["optimizer"]["state"]

    stage2 = tmp_path / "stage2"
    argv = pretrain_argv(
        data_dir, stage2, max_steps=2, save_steps=100, learning_rate=1e-3, lr_scheduler_type="linear",
        lr_scheduler_kwargs='{"alpha_f": 0.0}', warmup_steps=0, model_name_or_path=stage1, load_optimizer_state="true",
    )  # fmt: skip
    argv = _without_model_config(argv)
    assert main(argv + PLUGIN + ["--plugin_args", '{"tensors": true}']) == 0
    first = _updates()[0]
    assert first["lr"] == pytest.approx(5e-4)  # linear to 0 over 2 updates, update 1 at lr(1)
    assert set(state) == set(first["grads"])
    for name, g in first["grads"].items():
        s = state[name]
        assert float(s["step"]) == 4  # stage 1's per-parameter step count (bias correction) carries over
        expected = _adamw_by_hand(
            first["before"][name], g, s["exp_avg"], s["exp_avg_sq"], float(s["step"]),
            lr=first["lr"], beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
        )  # fmt: skip
        torch.testing.assert_close(first["after"][name], expected, rtol=1e-5, atol=1e-8)
    # and it is not what a fresh optimizer would do
    name = next(iter(first["grads"]))
    fresh = _adamw_by_hand(
        first["before"][name], first["grads"][name], 0.0, 0.0, 0,
        lr=first["lr"], beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1,
    )  # fmt: skip
    assert not torch.allclose(first["after"][name], fresh, rtol=1e-3, atol=0)


def test_load_optimizer_state_without_a_saved_state_is_a_clear_error(data_dir, tmp_path, capsys):
    stage1 = tmp_path / "stage1"
    assert main(pretrain_argv(data_dir, stage1, max_steps=1, save_steps=100)) == 0
    argv = pretrain_argv(data_dir, tmp_path / "stage2", model_name_or_path=stage1, load_optimizer_state="true")
    argv = _without_model_config(argv)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "save_optimizer_state: true" in capsys.readouterr().err


def _first_update(argv) -> dict:
    assert main(argv + PLUGIN + ["--plugin_args", '{"tensors": true, "inputs": true}']) == 0
    return _updates()[0]


def _hand_gradients(config: dict, weights: dict, loss_fn) -> dict:
    """The gradient of `loss_fn(model)` at `weights`, from a fresh model of `config` (no Trainer code)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import modeling_instella  # noqa: F401

    config = dict(config)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(config.pop("model_type"), **config))
    model.load_state_dict(weights)
    loss_fn(model).backward()
    return {n: p.grad for n, p in model.named_parameters()}


def test_instella_loss_is_summed_over_predictions_divided_by_input_tokens(data_dir, tmp_path):
    """OLMo: `ce_loss / num_items_in_batch` with `loss_reduction="sum"` and `num_items_in_batch =
    batch['input_ids'].numel()` (B x 64 here), over the B x 63 shifted predictions."""
    from tests.helpers.pretrain_utils import TINY_MODEL

    first = _first_update(pretrain_argv(data_dir, tmp_path / "run", max_steps=1, max_grad_norm=0, save_steps=100))
    (batch,) = first["inputs"]
    ids = batch["input_ids"]
    assert ids.shape == (4, 64) and "shift_labels" not in batch

    def summed_ce(model, denominator):
        logits = model(input_ids=ids).logits[:, :-1]
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum") / denominator

    expected = _hand_gradients(TINY_MODEL, first["before"], lambda m: summed_ce(m, ids.numel()))
    mean = _hand_gradients(TINY_MODEL, first["before"], lambda m: summed_ce(m, ids[:, 1:].numel()))
    for name, grad in first["grads"].items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-7)
    assert not torch.allclose(first["grads"]["lm_head.weight"], mean["lm_head.weight"], rtol=1e-3, atol=0)


LLAMA = {
    "model_type": "llama", "vocab_size": 512, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64, "tie_word_embeddings": False,
}  # fmt: skip


def test_amd_llama_trains_on_blocks_of_block_size_plus_one(tmp_path):
    """lit_gpt: blocks of 65 tokens (block_size 64 + 1); input_ids = block[:, :64], targets = block[:, 1:65],
    `nn.CrossEntropyLoss()` mean over all 64 x B predictions. The model reads 64 tokens (its context) and every
    one of them is trained; the targets are checked against the prepared file."""
    import json

    import numpy as np

    from instella_recipes.core import read_manifest

    data = prepare_tiny(tmp_path / "data", seq_len=65)
    manifest = read_manifest(data)
    blocks = np.fromfile(data / "tokens.bin", dtype=manifest["dtype"]).reshape(-1, 65).astype(np.int64)
    argv = pretrain_argv(
        data, tmp_path / "run", max_steps=1, max_grad_norm=0, save_steps=100, model_config=json.dumps(LLAMA),
        init="amd_llama", predict_all_positions="true", loss_reduction="mean",
    )  # fmt: skip
    first = _first_update(argv)
    (batch,) = first["inputs"]
    ids, targets = batch["input_ids"], batch["shift_labels"]
    assert ids.shape == targets.shape == (4, 64)
    by_start = {tuple(block[:64]): block for block in blocks}
    block = torch.tensor(np.stack([by_start[tuple(row.tolist())] for row in ids]))
    assert torch.equal(targets, block[:, 1:])  # the 65th token of each block is a target

    def lit_gpt_loss(model):
        return torch.nn.CrossEntropyLoss()(model(input_ids=block[:, :64]).logits.transpose(1, 2), block[:, 1:])

    expected = _hand_gradients(LLAMA, first["before"], lit_gpt_loss)
    for name, grad in first["grads"].items():
        torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-7)


def _recipe(name):
    """The settings twice (one object holds pretraining's fields and TrainingArguments'), as (script, train)."""
    (args,) = parse_recipe([PretrainArguments], ["--config", str(RECIPES / name), "--use_cpu", "true"])
    return args, args


@pytest.mark.parametrize(
    "name, steps, batch, per_device, offset",
    [
        ("amd-llama-135m/pretrain.yaml", 320_000, 512, 16, 0.0),
        ("amd-llama-135m/code_finetune.yaml", 42_000, 256, 8, 0.5),
    ],
)
def test_amd_llama_recipes_run_as_the_released_code(name, steps, batch, per_device, offset):
    script, train = _recipe(name)
    assert train.seed == 3407 and train.max_steps == steps  # tinyllama*.py: default_seed, max_step
    assert script.global_batch_size == batch == per_device * train.gradient_accumulation_steps * 32  # 4 x 8 GPUs
    assert "4 nodes x 8 GPUs (32)" in (RECIPES / name).read_text().splitlines()[0]
    assert train.lr_scheduler_kwargs == {"alpha_f": 0.1, "warmup_start_factor": 0.0, "lr_step_offset": offset}
    assert train.warmup_steps == 2000
    assert script.predict_all_positions and script.loss_reduction == "mean"  # 2049-token blocks, mean
    prepare = "prepare_data.yaml" if name.endswith("pretrain.yaml") else "prepare_code.yaml"
    assert "seq_len: 2049\n" in (RECIPES / "amd-llama-135m" / prepare).read_text()


def test_instella_stage1_leaves_and_stage2_loads_the_adamw_state():
    s1, _ = _recipe("instella-3b/pretrain_stage1.yaml")
    s2, _ = _recipe("instella-3b/pretrain_stage2.yaml")
    assert s1.save_optimizer_state and not s1.load_optimizer_state
    assert s2.load_optimizer_state and s2.model_name_or_path
    assert s1.loss_reduction == s2.loss_reduction == "input_tokens"  # B x 4096, instella/train.py:707
