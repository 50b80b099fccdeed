"""The demo pipeline (`recipes/tiny/pipeline.yaml`, the real entry points, TRL and lm-eval) at an even smaller size,
from data to DPO and the evaluations of stage 1 and SFT: every stage's output loads, the merge is the mean of the
three stage-2 seeds, SFT beats stage 1 on the task SFT teaches (the capitals of TinyWorld, asked as multiple choice
in the chat layout: lm-eval task tiny_world_facts_chat), and a second run skips everything."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import modeling_instella  # noqa: F401  (registers "instella")
from instella_recipes.evaluation.results import read_eval_results
from instella_recipes.pipeline.cli import main

# Smaller than the demo: hidden 64, 2 layers, fewer problems (so the 24 capital questions weigh more in SFT).
SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_layers": 2,
    "stage1_epochs": 3,
    "stage2_steps": 4,
    "n_train_problems": 120,
    "sft_epochs": 3,
    "sft_fact_repeat": 8,
    "dpo_epochs": 1,
    "eval_limit": 24,
    "grpo_steps": 3,
}
# The training chain and the two evaluations the assertion needs; the demo itself (`make demo`) runs the rest of the
# graph (draft, speculative decoding, release, report), each also tested on its own (test_release, test_pipeline_*).
STAGES = ["data", "tokenizer", "prepare", "stage1", "stage2", "merge", "sft", "dpo", "eval_stage1", "eval_sft", "grpo"]
MODELS = ["stage1", "stage2_5796", "stage2_6198", "stage2_8915", "merge", "sft", "dpo", "grpo"]


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def _score(run: Path, stage: str, task: str = "tiny_world_facts_chat", metric: str = "acc") -> float:
    rows = read_eval_results([run / f"eval_{stage}"])
    return next(r["value"] for r in rows if r["task"] == task and r["metric"] == metric)


@pytest.mark.slow
def test_whole_pipeline_small(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = tmp_path / "demo"
    overrides = [item for key, value in SMALL.items() for item in ("--set", f"{key}={value}")]
    overrides += [item for stage in STAGES for item in ("--stage", stage)]
    assert main(["--config", "recipes/tiny/pipeline.yaml", "--output_dir", str(run), *overrides]) == 0

    for name in MODELS:  # every checkpoint loads with its tokenizer and runs
        model = AutoModelForCausalLM.from_pretrained(run / name)
        tokenizer = AutoTokenizer.from_pretrained(run / name)
        ids = tokenizer("The capital of", return_tensors="pt").input_ids
        assert torch.isfinite(model(ids).logits).all(), name
    assert json.loads((run / "tokenizer" / "manifest.json").read_text())["tokenizer"]["kind"].startswith("trained")

    seeds = [_weights(run / f"stage2_{s}") for s in (5796, 6198, 8915)]
    merged = _weights(run / "merge")
    assert merged.keys() == seeds[0].keys()
    assert not torch.equal(seeds[0]["lm_head.weight"], seeds[1]["lm_head.weight"])  # the seeds differ
    for key, value in merged.items():
        torch.testing.assert_close(value, sum(s[key].float() for s in seeds) / 3, rtol=1e-6, atol=1e-7)

    assert _score(run, "sft") > _score(run, "stage1") + 0.1  # SFT teaches the capitals this task asks about
    assert {r["task"] for r in read_eval_results([run / "eval_sft"])} >= {"tiny_world_mc", "tiny_world_arithmetic"}
    # the math branch: GRPO from the SFT model with the verified answer as the reward, pass rates logged per step
    grpo = [h for h in json.loads((run / "grpo" / "trainer_state.json").read_text())["log_history"] if "reward" in h]
    assert [h["step"] for h in grpo] == [1, 2, 3] and all("pass@1" in h and "pass@4" in h for h in grpo)
    assert not (run / "report").exists()  # only the selected stages ran

    capsys.readouterr()
    assert main(["--config", "recipes/tiny/pipeline.yaml", "--output_dir", str(run), *overrides]) == 0
    assert "0 stage(s) ran" in capsys.readouterr().out
