"""Fault tolerance of scripts/pretrain.py: a SIGKILLed run resumes bit-exactly, SIGTERM saves and exits 0, a
2-process (gloo) run trains and checkpoints and its checkpoint resumes on 1 process; only complete checkpoints
are resumed from."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from instella_recipes.pretraining.pretrain import main
from instella_recipes.trainer.checkpoints import find_resume_checkpoint
from tests.helpers.pretrain_utils import pretrain_argv, resume_on_one_process

ROOT = Path(__file__).resolve().parents[2]
KILL = ["--plugins", "instella_recipes.pretraining.fault_injection:kill_at_step"]


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tiny_pretrain_data):
    return tiny_pretrain_data  # the data of tiny_pretrain_reference (tests/e2e/conftest.py)


def _env():
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    env.pop("RANK", None)
    return env


def _run(cmd, **kwargs):
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300, **kwargs)


def _losses(folder):
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def _weights(folder):
    return load_file(Path(folder) / "model.safetensors")


def test_sigkill_then_resume_matches_an_uninterrupted_run_bit_for_bit(data_dir, tiny_pretrain_reference, tmp_path):
    reference = tiny_pretrain_reference  # 8 steps, no checkpoint: saving does not change what a run computes

    run = tmp_path / "killed"
    plugin_args = ["--plugin_args", json.dumps({"kill_step": 5, "once_file": str(tmp_path / "killed-once")})]
    argv = pretrain_argv(data_dir, run, max_steps=8, save_steps=2) + KILL + plugin_args
    killed = _run([sys.executable, "scripts/pretrain.py", *argv])
    assert killed.returncode == -9, killed.stderr[-2000:]
    assert find_resume_checkpoint(run).endswith("checkpoint-4") and not (run / "manifest.json").exists()

    assert main(argv) == 0  # resume_from_checkpoint: auto
    assert _losses(run) == _losses(reference)
    ref, got = _weights(reference), _weights(run)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_sigterm_saves_a_checkpoint_and_exits_zero(data_dir, tmp_path):
    run = tmp_path / "preempted"
    argv = pretrain_argv(data_dir, run, max_steps=8, save_steps=100) + KILL
    done = _run(
        [sys.executable, "scripts/pretrain.py", *argv, "--plugin_args", '{"kill_step": 3, "kill_signal": "TERM"}']
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "pre-empted" in done.stderr  # the logger writes status lines to stderr
    # the signal arrives after step 3 was checked: the run stops and saves at the end of step 4
    assert find_resume_checkpoint(run).endswith("checkpoint-4") and not (run / "manifest.json").exists()


def test_incomplete_checkpoints_are_never_resumed_from(tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    (tmp_path / "checkpoint-10").mkdir()  # no trainer_state.json: killed mid-write by an older writer
    (tmp_path / ".staging" / "checkpoint-12").mkdir(parents=True)  # ours: still being written
    assert find_resume_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert find_resume_checkpoint(tmp_path / "missing") is None


@pytest.mark.slow
def test_two_process_run_checkpoints_and_resumes_on_one_process(data_dir, tmp_path):
    two = tmp_path / "two"
    argv = pretrain_argv(data_dir, two, max_steps=4, save_steps=2, per_device_train_batch_size=2)
    # accelerate's multi-CPU launcher needs srun/MPI (accelerate_configs/cpu_2proc_srun.yaml); torchrun is the launcher
    # accelerate uses for GPUs, and with use_cpu the Trainer's Accelerator runs gloo across the 2 processes.
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]  # a free port
    done = _run([*launch, "scripts/pretrain.py", *argv])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (two / "checkpoint-2" / "rng_state_1.pth").is_file() and (two / "manifest.json").is_file()

    one = tmp_path / "one"
    resume_on_one_process(data_dir, two, one)
    losses_two, losses_one = _losses(two), _losses(one)
    assert list(losses_one) == [1, 2, 3, 4]
    for step in (3, 4):  # the same samples in the same order: equal up to reduction order
        assert losses_one[step] == pytest.approx(losses_two[step], rel=1e-4)
    a, b = _weights(two), _weights(one)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


@pytest.mark.parametrize("phase", ["start", "end"])
def test_sigterm_outside_the_training_loop_exits_zero_in_a_consistent_state(data_dir, tmp_path, phase):
    """Issue 13.8: SIGTERM during start-up stops before anything is written; during the final save the save
    completes. Both exit 0 (not -15)."""
    run = tmp_path / phase
    plugin = ["--plugins", "instella_recipes.pretraining.fault_injection:signal_at_phase"]
    argv = pretrain_argv(data_dir, run, max_steps=2, save_steps=100) + plugin
    done = _run([sys.executable, "scripts/pretrain.py", *argv, "--plugin_args", json.dumps({"phase": phase})])
    assert done.returncode == 0, done.stderr[-2000:]
    if phase == "start":
        assert "pre-empted during start-up" in done.stderr and not run.exists()
    else:
        assert json.loads((run / "manifest.json").read_text())["global_step"] == 2


def _wait_for_lock(path: Path, limit: float = 120.0) -> bool:
    """Wait until nobody holds the stage lock `path`: the stage process (which inherits it) has exited."""
    import fcntl
    import time

    deadline = time.monotonic() + limit
    with open(path, "a") as handle:
        while time.monotonic() < deadline:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
                return True
            except BlockingIOError:
                time.sleep(0.1)
    return False


def test_sigkill_of_the_pipeline_runner_gives_the_stage_its_sigterm_checkpoint(
    data_dir, tiny_pretrain_reference, tmp_path
):
    """Issue 24.9: the runner SIGKILLed while it runs a pretraining stage (by the stage itself, at the end of step 2,
    so the moment is exact): the stage gets SIGTERM (PR_SET_PDEATHSIG, the watchdog), keeps a reader for its output
    (the watchdog copies it into the log) and takes the path of a direct SIGTERM: a checkpoint, no manifest. The next
    run of the pipeline resumes from it, bit for bit as an uninterrupted run."""
    reference = tiny_pretrain_reference  # the same command, uninterrupted
    args = dict(zip(*[iter(pretrain_argv(data_dir, "x", max_steps=8, save_steps=100))] * 2))
    recipe = {key[2:]: value for key, value in args.items() if key != "--output_dir"}
    recipe["plugins"] = ["instella_recipes.pretraining.fault_injection:kill_at_step"]
    recipe["plugin_args"] = {
        "kill_step": 2, "kill_signal": "KILL", "kill_target": "parent", "once_file": str(tmp_path / "killed-once")
    }  # fmt: skip
    (tmp_path / "recipe.yaml").write_text("# CPU, tiny: global batch 4 x 64 tokens\n" + json.dumps(recipe))
    graph = tmp_path / "pipeline.yaml"
    graph.write_text(
        f"output_dir: {tmp_path / 'run'}\nenv: {{OMP_NUM_THREADS: '1', TOKENIZERS_PARALLELISM: 'false'}}\nstages:\n"
        f"  - {{name: stage1, command: scripts/pretrain.py, recipe: {tmp_path / 'recipe.yaml'}, "
        "args: {output_dir: '{output}'}}\n"
    )
    runner = [sys.executable, "scripts/pipeline.py", "--config", str(graph), "--verbose"]
    killed = _run(runner)
    assert killed.returncode == -9, killed.stderr[-2000:]
    run, log = tmp_path / "run" / "stage1", tmp_path / "run" / "logs" / "stage1.log"
    assert _wait_for_lock(tmp_path / "run" / "stage1.lock"), "the stage did not stop"
    checkpoint = find_resume_checkpoint(run)
    assert checkpoint is not None and not (run / "manifest.json").exists(), log.read_text()[-3000:]
    step = int(checkpoint.rsplit("-", 1)[1])
    assert 2 <= step < 8
    text = log.read_text()
    assert "the runner has ended" in text and f"pre-empted; saved checkpoint-{step}" in text, text[-3000:]

    resumed = _run(runner)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {checkpoint}" in log.read_text()
    assert json.loads((run / "manifest.json").read_text())["global_step"] == 8
    assert _losses(run) == _losses(reference)
    ref, got = _weights(reference), _weights(run)
    assert all(torch.equal(ref[k], got[k]) for k in ref)
