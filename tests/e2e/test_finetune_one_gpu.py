"""The one-GPU fine-tune recipes (recipes/instella-3b/finetune-{lora,full}-1gpu.yaml, docs/finetune_one_gpu.md) run
as written on CPU with tiny overrides: a saved tiny Instella stands in for the Hub model (`amd/Instella-3B-Instruct`,
`amd/Instella-3B`) and a local parquet with ultrachat_200k's columns for the Hub dataset; every other recipe key
(LoRA block, activation checkpointing, schedule, per-source sampling, converter) is the recipe's own."""

from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from instella_recipes.core import read_manifest
from instella_recipes.data.tiny_world import TinyWorld
from instella_recipes.post_training import sft

ROOT = Path(__file__).resolve().parents[2]
RECIPES = {"lora": ROOT / "recipes/instella-3b/finetune-lora-1gpu.yaml",
           "full": ROOT / "recipes/instella-3b/finetune-full-1gpu.yaml"}  # fmt: skip
# What makes it small and CPU-only; nothing else is overridden.
TINY = ["--bf16", "false", "--dtype", "float32", "--max_length", "64", "--per_device_train_batch_size", "2",
        "--gradient_accumulation_steps", "2", "--global_batch_size", "4", "--max_steps", "3", "--warmup_steps", "1",
        "--save_strategy", "no", "--report_to", "none", "--dataset_num_proc", "1", "--logging_steps", "1"]  # fmt: skip

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hub_dataset(tmp_path_factory) -> Path:
    """ultrachat_200k's train_sft columns (prompt, prompt_id, messages) with TinyWorld conversations."""
    folder = tmp_path_factory.mktemp("ultrachat_200k")
    rows = [
        {"prompt": chat["messages"][0]["content"], "prompt_id": f"{i:04d}", "messages": chat["messages"]}
        for i, chat in enumerate(TinyWorld().sft()[:48])
    ]
    pd.DataFrame(rows).to_parquet(folder / "train_sft-00000-of-00001.parquet")
    return folder


def _argv(kind: str, model_dir: Path, data: Path, out: Path) -> list[str]:
    """The recipe, with the local model and dataset in place of the Hub ids (the source keeps its other keys)."""
    recipe = yaml.safe_load(RECIPES[kind].read_text())
    assert recipe["model_name_or_path"].startswith("amd/Instella-3B")
    (source,) = recipe["sources"]
    assert source["path"] == "HuggingFaceH4/ultrachat_200k" and source["converter"] == "messages"
    local = yaml.safe_dump({**source, "path": str(data), "max_samples": 32}, default_flow_style=True).strip()
    model = ["--model_name_or_path", str(model_dir), "--sources", local, "--output_dir", str(out)]
    return ["--config", str(RECIPES[kind]), *model, *TINY]


def test_lora_recipe_runs_with_a_local_model_and_dataset(tiny_model_dir, hub_dataset, tmp_path):
    out = tmp_path / "lora"
    assert sft.main(_argv("lora", tiny_model_dir, hub_dataset, out)) == 0
    manifest = read_manifest(out)
    assert manifest["global_step"] == 3 and manifest["lora"]["r"] == 16 and manifest["lora"]["merged"]
    assert manifest["data"]["sources"][0]["rows"] == 32  # the source's own sampling, capped for the test
    assert manifest["arguments"]["training"]["activation_checkpointing"] is True
    assert (out / "adapter" / "adapter_config.json").is_file()
    base, merged = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    changed = [k for k in base if not torch.equal(base[k], merged[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)  # only the LoRA targets moved
    losses = [h["loss"] for h in _log(out) if "loss" in h]
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))


def test_full_recipe_runs_with_a_local_model_and_dataset(tiny_model_dir, hub_dataset, tmp_path):
    out = tmp_path / "full"
    assert sft.main(_argv("full", tiny_model_dir, hub_dataset, out)) == 0
    assert read_manifest(out)["global_step"] == 3 and read_manifest(out)["lora"] is None
    base, trained = load_file(tiny_model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(not torch.equal(base[k], trained[k]) for k in base)  # every parameter trains (norms included)


def _log(out: Path) -> list[dict]:
    import json

    return json.loads((out / "trainer_state.json").read_text())["log_history"]


def test_the_docs_memory_table_is_what_sizing_computes():
    """docs/finetune_one_gpu.md quotes scripts/sizing.py for both recipes (with and without activation
    checkpointing); the numbers are recomputed here from the recipes' own batch, length, dtype and LoRA rank."""
    from instella_recipes.systems.sizing import Cluster, lora_params, memory_per_gpu, resolve_config
    from instella_recipes.trainer.flops import count_params_from_config

    config = resolve_config("instella-3b")
    counts = count_params_from_config(config)
    doc = (ROOT / "docs" / "finetune_one_gpu.md").read_text()
    for kind, path in RECIPES.items():
        recipe = yaml.safe_load(path.read_text())
        lora = recipe.get("lora_r", 0) if recipe.get("use_peft") else 0
        # logit_bytes 4: TRL's fused LM head; the recipes accumulate gradients over micro-steps
        common = dict(gpus_per_node=1, micro_batch=recipe["per_device_train_batch_size"], seq_len=recipe["max_length"],
                      weight_bytes=2 if recipe["dtype"] == "bfloat16" else 4, lora_r=lora,
                      logit_bytes=4, accumulation=recipe["gradient_accumulation_steps"])  # fmt: skip
        with_ckpt = memory_per_gpu(config, counts, Cluster(**common, activation_checkpointing=True))["DDP"]
        without = memory_per_gpu(config, counts, Cluster(**common, activation_checkpointing=False))["DDP"]
        cells = [with_ckpt[k] for k in ("weights", "gradients", "optimizer", "activations", "total")]
        row = " | ".join(f"{v:.1f}" for v in cells) + f" | {without['total']:.1f} |"
        assert row in doc, f"{kind}: the docs should say {row}"
        assert f"{with_ckpt['total']:.1f} GB" in path.read_text().splitlines()[0]  # the recipe's first line
    assert f"LoRA ({lora_params(config, 16):,} adapter parameters)" in doc
