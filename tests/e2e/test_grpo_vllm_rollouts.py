"""GRPO rollouts through vLLM (`use_vllm: true`, `vllm_mode: colocate`, as the published recipes run) on CPU, in the
vLLM venv (`make vllm-env` -> `.venv-vllm`, or `INSTELLA_VLLM_PYTHON`; docs: ../shared/VLLM_ON_CPU.md).

That venv has vLLM and its own transformers but neither TRL nor accelerate nor this project, and pip-installing
into it could move its torch. The smallest honest layering: a test-local folder with links to the project venv's
`trl` and `accelerate` (pure Python) put first on the vLLM python's PYTHONPATH with this checkout's `src/`, so the
same `scripts/grpo.py` runs there with vLLM's engine generating the rollouts and TRL syncing the weights into it
(through vLLM's in-place reload, `ReloadingVLLMGeneration`, for a vLLM newer than TRL's tested range).

The check that the engine generates with the trained weights: TRL's importance-sampling bookkeeping
(`vllm_importance_sampling_correction: true`) logs, per step, the largest |log-prob of vLLM - log-prob of the
trainer's model| over the sampled tokens. Step 2's rollouts are generated after the first update: a stale engine
would differ there by about as much as the update moved the log-probs (checked to be far larger than the bound)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from instella_recipes.evaluation.preflight import vllm_python
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def overlay(folder: Path) -> Path:
    """Links to the project venv's TRL and accelerate (packages and their metadata) in one folder."""
    import accelerate
    import trl

    folder.mkdir()
    for module in (trl, accelerate):
        package = Path(module.__file__).parent
        (folder / package.name).symlink_to(package)
        for meta in package.parent.glob(f"{package.name}-*.dist-info"):
            (folder / meta.name).symlink_to(meta)
    return folder


def test_tiny_grpo_with_vllm_colocated_rollouts(tiny_tokenizer, tmp_path):
    python = vllm_python()
    if not python.is_file():
        pytest.skip(f"no vLLM venv at {python} (make vllm-env, or set INSTELLA_VLLM_PYTHON)")
    torch.manual_seed(0)
    start = InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer), num_attention_heads=2))
    start.save_pretrained(tmp_path / "start")  # 2 heads of 32: vLLM's CPU attention has no kernel for head size 16
    tiny_tokenizer.save_pretrained(tmp_path / "start")
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny" / "grpo.yaml").read_text())
    recipe.pop("activation_checkpointing", None)  # the vLLM venv's transformers may predate the new name
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "grpo"
    argv = [str(python), "scripts/grpo.py", "--config", str(tmp_path / "grpo.yaml"),
            "--model_name_or_path", str(tmp_path / "start"), "--output_dir", str(out), "--report_to", "none",
            "--max_steps", "2", "--per_device_train_batch_size", "16", "--global_batch_size", "16",
            "--learning_rate", "1e-2",  # one update moves the log-probs far more than vLLM's rounding
            "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_model_impl", "transformers",
            "--trust_remote_code", "true", "--vllm_max_model_length", "128",
            "--vllm_importance_sampling_correction", "true",
            "--reward_funcs", "tests.helpers.grpo_rewards.digit_share"]  # fmt: skip
    paths = os.pathsep.join(str(p) for p in (overlay(tmp_path / "overlay"), ROOT / "src", ROOT))
    env = {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_TARGET_DEVICE": "cpu"}  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sys.executable != str(python)  # the rollouts ran in the vLLM interpreter, not this one

    logs = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "reward" in h]
    assert [h["step"] for h in logs] == [1, 2]
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 2
    trained = InstellaForCausalLM.from_pretrained(out)  # the final folder loads
    ids = torch.tensor([tiny_tokenizer("Tom has 3 apples and buys 4 more. How many apples does Tom have?").input_ids])
    with torch.no_grad():
        moved = (trained(ids).logits.log_softmax(-1) - start(ids).logits.log_softmax(-1)).abs().max().item()
    # the engine generated step 2's rollouts with the weights of step 1, not the starting ones: its log-probs of
    # the sampled tokens equal the trainer's to vLLM's rounding (about 2e-3 measured at step 1, same weights on
    # both sides), far below what the updates moved them
    difference = [h["sampling/sampling_logp_difference/max"] for h in logs]
    assert difference[1] < 1e-2 < 10 * 1e-2 < moved, (difference, moved)
