"""scripts/sft.py with Ulysses sequence parallelism on 2 gloo processes against 1 process: padding-free packed rows
(documents told apart by position_ids), the exact path, the same per-step losses; and the authors' all-token loss
normaliser (`loss_reduction: input_tokens`: each device's tokens / SP size) on the same rows."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from instella_recipes.post_training import sft
from tests.unit.post_training import test_sft_train as unit_half  # the tiny SFT recipe both halves use

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _losses(folder) -> dict[int, float]:
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def _argv(model_dir, out, **overrides) -> list[str]:
    values = {"config": unit_half.TINY_SFT, "model_name_or_path": model_dir, "output_dir": out, "max_steps": 3,
              "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2, "global_batch_size": 2,
              "packing": "true", "pad_to_multiple_of": 2, "max_length": 128, "logging_steps": 1, "use_cpu": "true",
              "loss_reduction": "input_tokens", "average_tokens_across_devices": "false",
              "report_to": "none"}  # fmt: skip
    values.update(overrides)
    return [word for key, value in values.items() for word in (f"--{key}", str(value))]


def test_two_process_sequence_parallel_sft_gives_the_one_process_losses(tiny_model_dir, tmp_path):
    assert sft.main(_argv(tiny_model_dir, tmp_path / "one")) == 0
    argv = _argv(tiny_model_dir, tmp_path / "sp2", sequence_parallel_size=2, sequence_parallel_mode="exact")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run([*launch, str(ROOT / "scripts/sft.py"), *argv], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    one, sp2 = _losses(tmp_path / "one"), _losses(tmp_path / "sp2")
    assert sorted(one) == sorted(sp2) == [1, 2, 3]
    for step in one:
        assert abs(one[step] - sp2[step]) < 1e-4, (step, one[step], sp2[step])
