"""scripts/pretrain.py with Ulysses sequence parallelism on 2 gloo processes (`--sequence_parallel_size 2`) against
the same run on 1 process: the tiny pretraining run (document masking on) gives the same per-step losses."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from instella_recipes.pretraining.pretrain import main
from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _losses(folder) -> dict[int, float]:
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def test_two_process_sequence_parallel_gives_the_one_process_losses(tmp_path):
    data_dir = prepare_tiny(tmp_path / "data")  # 64-token windows: two 32-token chunks
    # one row per micro-step (SP takes batch 1), 4 micro-steps per update: the same rows in the same order
    common = dict(max_steps=4, per_device_train_batch_size=1, gradient_accumulation_steps=4, global_batch_size=4,
                  document_masking="true", save_strategy="no")  # fmt: skip
    assert main(pretrain_argv(data_dir, tmp_path / "one", **common)) == 0
    argv = pretrain_argv(
        data_dir, tmp_path / "sp2", **common, sequence_parallel_size=2, sequence_parallel_mode="exact"
    )
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run([*launch, str(ROOT / "scripts/pretrain.py"), *argv], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    one, sp2 = _losses(tmp_path / "one"), _losses(tmp_path / "sp2")
    assert sorted(one) == sorted(sp2) == [1, 2, 3, 4]
    for step in one:
        assert abs(one[step] - sp2[step]) < 1e-4, (step, one[step], sp2[step])
    manifest = json.loads((tmp_path / "sp2" / "manifest.json").read_text())
    assert manifest["world_size"] == 2
