"""LoRA SFT and DPO: only the adapters train, the adapter merges into a normal HF folder that loads with
`from_pretrained` and gives the same logits as the unmerged model."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from trl import ModelConfig

from instella_recipes.core import parse_recipe, read_manifest
from instella_recipes.post_training import dpo, sft
from instella_recipes.post_training.shared import INSTELLA_PROJECTIONS

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "tiny"
LORA = ["--use_peft", "true", "--lora_r", "8", "--lora_alpha", "16", "--lora_dropout", "0.0",
        "--lora_target_modules", *INSTELLA_PROJECTIONS]  # fmt: skip


pytestmark = pytest.mark.usefixtures("one_thread")


def train_lora(module, config, arg_types, model_dir, out, *extra):
    argv = ["--config", str(RECIPES / config), "--model_name_or_path", str(model_dir), "--output_dir", str(out),
            *LORA, *extra]  # fmt: skip
    training_args, model_args = parse_recipe(arg_types, argv)
    stage = module.SFTStage if module is sft else module.DPOStage
    trainer, data = module.build_trainer(training_args, model_args)
    trainer.train()
    return trainer, stage(training_args, model_args, argv).finish(trainer, data)


def test_lora_sft_trains_only_adapters_and_merges(tiny_model_dir, tmp_path):
    base = load_file(tiny_model_dir / "model.safetensors")
    trainer, out = train_lora(
        sft, "sft.yaml", [sft.CheckedSFTConfig, ModelConfig], tiny_model_dir, tmp_path / "sft-lora",
        "--max_samples", "64", "--num_train_epochs", "1", "--learning_rate", "1e-2",
    )  # fmt: skip
    model = trainer.model
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    adapted = {n.split(".")[-4] for n in trainable if "lora_A" in n}  # ...q_proj.lora_A.default.weight
    assert adapted == set(INSTELLA_PROJECTIONS)  # every Instella projection has an adapter
    # base weights untouched, every adapter B matrix moved away from its zero init
    for name, tensor in model.get_base_model().state_dict().items():
        key = name.replace(".base_layer", "")
        if key in base:
            torch.testing.assert_close(tensor, base[key], rtol=0, atol=0)
    assert all(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)

    ids = torch.tensor([trainer.train_dataset[0]["input_ids"]])
    model.eval()
    with torch.no_grad():
        unmerged = model(input_ids=ids).logits
        base_logits = AutoModelForCausalLM.from_pretrained(tiny_model_dir)(input_ids=ids).logits
    merged = AutoModelForCausalLM.from_pretrained(out)  # a normal HF folder: no PEFT involved
    assert type(merged).__name__ == "InstellaForCausalLM" and not (out / "adapter_config.json").exists()
    assert (out / "adapter" / "adapter_config.json").is_file()
    with torch.no_grad():
        merged_logits = merged(input_ids=ids).logits
    torch.testing.assert_close(merged_logits, unmerged, rtol=1e-4, atol=1e-4)
    assert (merged_logits - base_logits).abs().max() > 1e-3  # the adapter did change the model
    manifest = read_manifest(out)
    lora = {"r": 8, "alpha": 16, "dropout": 0.0, "target_modules": list(INSTELLA_PROJECTIONS), "merged": True}
    assert manifest["lora"] == lora
    # what ran, not what the recipe file says: the command line's learning rate and sample cap
    assert manifest["arguments"]["training"]["learning_rate"] == 1e-2
    assert manifest["arguments"]["training"]["max_samples"] == 64 and manifest["arguments"]["model"]["use_peft"]


@pytest.mark.slow
def test_lora_dpo_uses_the_disabled_adapter_as_reference_and_merges(tiny_model_dir, tmp_path):
    trainer, out = train_lora(
        dpo, "dpo.yaml", [dpo.CheckedDPOConfig, ModelConfig], tiny_model_dir, tmp_path / "dpo-lora",
        "--max_samples", "96", "--learning_rate", "1e-2", "--logging_steps", "1",
    )  # fmt: skip
    assert trainer.ref_model is None  # PEFT: the reference is the base model with the adapter disabled
    logs = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert logs[-1]["rewards/margins"] > logs[0]["rewards/margins"]
    merged = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([[0, 5, 6, 7, 8]])
    trainer.model.eval()
    with torch.no_grad():
        expected = trainer.model(input_ids=ids).logits
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
