"""MoE plugins: ZAYA balancing-bias controller, OLMoE router z-loss, per-expert load logging (tiny CPU runs)."""

import importlib
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

from instella_recipes.core import RecipeError
from instella_recipes.pretraining import moe, throughput
from instella_recipes.trainer.flops import count_params, flops_per_token

RECIPES = Path(__file__).resolve().parents[3] / "recipes" / "zaya1"


pytestmark = pytest.mark.usefixtures("one_thread")


def recipe_model(name: str, **overrides):
    fields = dict(yaml.safe_load((RECIPES / name).read_text())["model_config"]) | overrides
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config), yaml.safe_load((RECIPES / name).read_text())


def progressions(vocab: int, rows: int = 32, length: int = 32) -> Dataset:
    """Learnable sequences: arithmetic progressions mod vocab with a few strides."""
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(rows):
        start, stride = torch.randint(0, vocab, (2,), generator=g).tolist()
        ids = [(start + i * (stride % 5 + 1)) % vocab for i in range(length)]
        data.append({"input_ids": ids, "labels": ids})
    return Dataset.from_list(data)


def train(model, callbacks, tmp_path, steps=20):
    args = TrainingArguments(
        str(tmp_path), max_steps=steps, per_device_train_batch_size=8, learning_rate=3e-3, logging_steps=5,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, warmup_steps=2,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=progressions(model.config.vocab_size), callbacks=callbacks)
    trainer.train()
    return [row for row in trainer.state.log_history if "loss" in row]


def plugins(model, recipe, enabled):
    callbacks = []
    for path in recipe["plugins"]:  # how pretrain.py calls them: "package.module:function"
        module, name = path.split(":")
        if name in enabled:
            callbacks += getattr(importlib.import_module(module), name)(model, recipe["plugin_args"])
    return callbacks


def test_controller_update_raises_underloaded_experts():
    model, recipe = recipe_model("tiny_zaya.yaml", num_hidden_layers=1)
    (controller,) = moe.zaya_bias_controller(model, {"zaya_bias_gain": 0.5})
    model.to(torch.bfloat16)  # replaces the buffer tensors after the plugin was made (as Trainer's .to(device) does)
    counts = torch.tensor([[10.0, 0, 0, 0, 0, 0, 0, 30, 5]])  # expert 0 and 7 overloaded; last column = skip
    controller.update(counts)
    biases = model.model.layers[0].mlp.gate.balancing_biases
    assert biases.dtype == torch.bfloat16 and biases.tolist() == [-0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, -0.5, -1.0]
    for _ in range(1000):  # small steps accumulate in fp32 (bf16 alone would round 1e-4 steps away near 0.5)
        controller.gain = 1e-4
        controller.update(counts)
    assert biases[1].item() == pytest.approx(0.6, abs=4e-3) and biases[0].item() == pytest.approx(-0.6, abs=4e-3)


def test_olmoe_router_z_loss_and_load_logging(tmp_path):
    model, recipe = recipe_model("tiny_olmoe.yaml", vocab_size=128)
    batch = progressions(128, rows=2).with_format("torch")[:]
    model.train()
    plain = model(**batch).loss
    callbacks = plugins(model, recipe, {"router_z_loss", "expert_load_logging"})
    callbacks += throughput.mfu_logging(model, {"mfu_peak": 1e12})
    z_loss = next(cb.z_loss for cb in callbacks if isinstance(cb, moe.RouterZLossLoggingCallback))
    with_z = model(**batch).loss
    # Exactly coef x mean over layers of mean(logsumexp(router logits)^2), on top of CE + Switch aux loss.
    out = model(**batch, output_router_logits=True)
    expected = torch.stack([torch.logsumexp(x.float(), -1).pow(2).mean() for x in out.router_logits]).mean()
    assert with_z.item() == pytest.approx(plain.item() + 0.001 * expected.item(), rel=1e-6)
    assert z_loss.last_value == pytest.approx(expected.item(), rel=1e-6)
    logs = train(model, callbacks, tmp_path)
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.5
    assert "moe/router_z_loss" in logs[-1] and "moe/l1/e7" in logs[-1]
    assert sum(logs[-1][f"moe/l1/e{e}"] for e in range(8)) == pytest.approx(1.0, abs=1e-4)
    # MFU from the logged throughput with active parameters only (top-2 of 8 experts), at the batch's length 32.
    flops = flops_per_token(model.config, 32, count_params(model))
    assert logs[-1]["perf/mfu"] == pytest.approx(logs[-1]["perf/tokens_per_second"] * flops / 1e12, rel=1e-3)


def test_bad_plugin_args_and_dense_model_are_clear_errors():
    model, _ = recipe_model("tiny_zaya.yaml", num_hidden_layers=1)
    with pytest.raises(RecipeError, match="mfu_peak"):
        throughput.mfu_logging(model, {"mfu_peak": "TPUv9"})
    with pytest.raises(RecipeError, match="zaya_bias_gain"):
        moe.zaya_bias_controller(model, {"zaya_bias_gain": -1})
    with pytest.raises(RecipeError, match="zaya_bias_update"):
        moe.zaya_bias_controller(model, {"zaya_bias_update": "pid"})
    olmoe, _ = recipe_model("tiny_olmoe.yaml", num_hidden_layers=1)
    with pytest.raises(RecipeError, match="ZAYA"):
        moe.zaya_bias_controller(olmoe, {})
    dense = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", hidden_size=16, num_hidden_layers=1,
                                                                  num_attention_heads=2, intermediate_size=16,
                                                                  vocab_size=32))  # fmt: skip
    with pytest.raises(RecipeError, match="no MoE router"):
        moe.expert_load_logging(dense, {})


@pytest.mark.parametrize("name", ["zaya1_base_mi300x.yaml", "olmoe_1b7b_mi300x.yaml"])
def test_cluster_recipes_build_and_state_hardware_first(name):
    text = (RECIPES / name).read_text()
    assert text.startswith("# 128 x MI300X") and "global batch 1024 x 4096" in text.splitlines()[0]
    recipe = yaml.safe_load(text)
    fields = dict(recipe["model_config"])
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    callbacks = plugins(model, recipe, {"zaya_bias_controller", "router_z_loss", "expert_load_logging", "mfu_logging"})
    assert len(callbacks) == 3 and callbacks[-1].peak == 1307e12
    assert recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] * 128 == 1024
