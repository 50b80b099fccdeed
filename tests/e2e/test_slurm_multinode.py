"""The published multi-node launch on a real 2-node Slurm (the run's private cluster, tests/helpers/slurm_cluster.py:
nodes n1 and n2, each a slurmd in its own namespaces with its own hostname, loopback address and munged), and the
faults a multi-node run meets: a node lost mid-run, a requeue that comes back on fewer nodes, a hung rank, a
pre-emption.

`sbatch -N 2 scripts/slurm/launch.sbatch tiny/pretrain_stage1 ...` (CPU: one process per node, gloo, the tiny model,
6 steps, checkpoint every 2) is the reference: it matches a 1-process run of the same global batch within 1e-4 and
the faulted runs resume to exactly its weights. Timings of each fault are printed (`pytest -s`), not asserted;
docs/slurm.md quotes them."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from instella_recipes.pipeline.cli import main as pipeline_main
from instella_recipes.pretraining.pretrain import main as pretrain_main
from tests.helpers.pretrain_utils import TINY_MODEL, prepare_tiny
from tests.helpers.slurm_cluster import job_info

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "tiny/pretrain_stage1"
DDP_TIMEOUT_S = 10  # the hung-rank run's collective timeout (`ddp_timeout`; 60 s elsewhere, above any start-up skew)
SAVE_STEPS = 2
FINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster", "one_thread")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


def overrides(data_dir, output_dir, **extra) -> dict:
    """The recipe overrides of every run here: the tiny model, global batch 4 (2 per process on 2 nodes), 6 steps."""
    values = {
        "data_dir": str(data_dir), "output_dir": str(output_dir), "model_config": json.dumps(TINY_MODEL),
        "max_steps": 6, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "global_batch_size": 4,
        "warmup_steps": 2, "save_steps": SAVE_STEPS, "ddp_timeout": 60, "report_to": "none", "disable_tqdm": "true",
    }  # fmt: skip
    values.update(extra)
    return values


def as_argv(values: dict) -> list[str]:
    return [item for key, value in values.items() for item in (f"--{key}", str(value))]


def fault(**plugin_args) -> dict:
    """The fault-injection plugin's overrides (instella_recipes.pretraining.fault_injection.kill_at_step)."""
    plugin = "instella_recipes.pretraining.fault_injection:kill_at_step"
    return {"plugins": plugin, "plugin_args": json.dumps(plugin_args, default=str)}


def sbatch(cluster, tmp_path, values: dict, nodes: str = "2") -> tuple[str, Path]:
    """`sbatch -N <nodes> scripts/slurm/launch.sbatch tiny/pretrain_stage1 <overrides>` on CPU nodes, once both
    nodes are idle (a node still completing the previous job would make `-N 1-2` start on one); (job id, log)."""
    cluster.wait_nodes_idle()
    log = tmp_path / "launch.log"
    env = {**os.environ, **ENV, "ACCELERATE_CONFIG": "accelerate_configs/cpu_2proc_srun.yaml", "GPUS_PER_NODE": "1",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}  # fmt: skip
    command = ["sbatch", "--parsable", "-N", nodes, "--gpus-per-node=0", "--cpus-per-task=1", f"--output={log}",
               "--open-mode=append", "scripts/slurm/launch.sbatch", RECIPE, *as_argv(values)]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0], log


class Timeline:
    """Seconds since the fault of each first-seen event (job state, node state, log line), printed at the end
    (`pytest -s`; docs/slurm.md quotes them)."""

    PATTERNS = {
        "Connection closed by peer": "survivor failed (peer gone)",
        "Connection reset by peer": "survivor failed (peer gone)", "Timed out waiting": "survivor timed out",
        "USR1: asking every rank": "USR1 relayed to every task", "SIGUSR1 received": "ranks agreed to stop",
        "requeueing job": "requeue asked", "resuming from": "resumed run started",
    }  # fmt: skip

    def __init__(self, name: str, cluster, job: str, log: Path):
        self.name, self.cluster, self.job, self.log = name, cluster, job, log
        self.t0, self.events = time.monotonic(), {}

    def mark(self, event: str) -> None:
        self.events.setdefault(event, round(time.monotonic() - self.t0, 1))

    def observe(self) -> dict:
        """Note what is new; returns the job's `scontrol show job` fields."""
        info = job_info(self.job)
        self.mark(f"{info.get('JobState', '').lower()} (restart {info.get('Restarts', '0')})")
        text = self.log.read_text() if self.log.is_file() else ""
        for pattern, event in self.PATTERNS.items():
            if pattern in text:
                self.mark(event)
        for node, state in self.cluster.node_states().items():
            if not state.startswith(("idle", "alloc", "mix", "completing")):
                self.mark(f"{node} {state}")
        return info

    def show(self) -> None:
        print(f"\n{self.name}: " + ", ".join(f"{k} +{v} s" for k, v in self.events.items()))


def wait_for(condition, timeout: float, what: str, log: Path | None = None):
    """Poll `condition()` until it returns a true value; fail with the log's tail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.2)
    tail = log.read_text()[-3000:] if log is not None and log.is_file() else ""
    raise AssertionError(f"{what}: not within {timeout} s\n{tail}")


def wait_job_end(job: str, log: Path, timeout: float = 240, timeline: Timeline | None = None) -> dict:
    """Follow the job (through requeues) until it ended for good, noting events in `timeline`."""

    def ended():
        info = timeline.observe() if timeline is not None else job_info(job)
        return info if info.get("JobState") in FINAL else None

    return wait_for(ended, timeout, f"job {job} to end", log=log)


def losses(folder) -> dict[int, float]:
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def assert_same_weights(a, b) -> None:
    ref, got = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    assert ref.keys() == got.keys()
    different = [k for k in ref if not torch.equal(ref[k], got[k])]
    assert not different, f"not bit-exact: {different[:5]}"


@pytest.fixture(scope="module")
def two_nodes(slurm_cluster, data_dir, tmp_path_factory):
    """The uninterrupted reference: the published launch on 2 nodes, one process each (world size 2)."""
    tmp = tmp_path_factory.mktemp("two_nodes")
    job, log = sbatch(slurm_cluster, tmp, overrides(data_dir, tmp / "run"))
    info = wait_job_end(job, log)
    assert info["JobState"] == "COMPLETED", log.read_text()[-3000:]
    return {"run": tmp / "run", "log": log, "info": info}


def test_published_launch_on_two_nodes_matches_one_process(two_nodes, data_dir, tmp_path):
    """One `accelerate launch` per node (machine rank = SLURM_NODEID, main process = n1 by name), gloo across the
    nodes: world size 2, the losses of a 1-process run with the same global batch (2 x 2 accumulation) within rel
    1e-4, and one complete checkpoint."""
    run, text = two_nodes["run"], two_nodes["log"].read_text()
    assert two_nodes["info"]["NodeList"] == "n[1-2]" and "--main_process_ip n1 " in text
    assert json.loads((run / "manifest.json").read_text())["world_size"] == 2
    checkpoints = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-"))
    assert checkpoints == ["checkpoint-6"]  # save_total_limit 1: the last one, complete, nothing half-written beside
    assert not list(run.glob(".staging/*"))
    for name in ("trainer_state.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth",
                 "rng_state_1.pth"):  # fmt: skip
        assert (run / "checkpoint-6" / name).is_file(), name

    one = tmp_path / "one"
    argv = ["--config", f"recipes/{RECIPE}.yaml", *as_argv(overrides(data_dir, one, gradient_accumulation_steps=2))]
    assert pretrain_main(argv) == 0
    got, ref = losses(run), losses(one)
    assert sorted(got) == sorted(ref) == list(range(1, 7))
    for step in ref:  # the same samples per step; DDP's all-reduce vs accumulation sums them in another order
        assert got[step] == pytest.approx(ref[step], rel=1e-4)


def test_pipeline_stage_runs_as_one_job_over_both_nodes(two_nodes, data_dir, tmp_path):
    """`--executor slurm --slurm stage1.nodes=2`: the stage is one job on n[1-2], one `accelerate launch` per node
    through srun, and trains exactly what the published launch trains."""
    args = overrides(data_dir, "{output}")
    stage = {"name": "stage1", "command": "scripts/pretrain.py", "recipe": f"recipes/{RECIPE}.yaml",
             "accelerate_config": "accelerate_configs/cpu_2proc_srun.yaml", "args": args}  # fmt: skip
    path = tmp_path / "pipeline.yaml"
    path.write_text("# CPU, 2 nodes\n" + yaml.safe_dump({"output_dir": str(tmp_path / "out"), "env": ENV,
                                                        "stages": [stage]}, sort_keys=False))  # fmt: skip
    argv = ["--config", str(path), "--executor", "slurm", "--slurm", "stage1.nodes=2", "--wait"]
    assert pipeline_main(argv) == 0
    job = json.loads((tmp_path / "out" / "pipeline" / "stage1.slurm.json").read_text())["job_id"]
    assert job_info(job)["NodeList"] == "n[1-2]"
    run = tmp_path / "out" / "stage1"
    assert json.loads((run / "manifest.json").read_text())["world_size"] == 2
    assert losses(run) == losses(two_nodes["run"])
    assert_same_weights(two_nodes["run"], run)


def take_node_away(slurm_cluster, once: Path, job: str, log: Path, name: str) -> Timeline:
    """When rank 1 (on n2) reaches the end of step 3 (it stops there, `once` appears), SIGKILL every process of n2:
    slurmd, munged, the job step, the launcher and the training."""
    wait_for(once.exists, 120, "rank 1 to reach step 3", log=log)
    slurm_cluster.kill_node(2)
    return Timeline(name, slurm_cluster, job, log)


def test_node_lost_mid_run_requeues_and_resumes_bit_exact(two_nodes, slurm_cluster, data_dir, tmp_path):
    """n2 disappears after step 3 (checkpoint-2 is the last complete one). The survivor on n1 fails (its peer's
    connection is gone), Slurm marks n2 down after SlurmdTimeout and requeues the job (NODE_FAIL, --requeue); it waits
    for 2 nodes, n2 comes back, the job resumes from checkpoint-2 and ends with the uninterrupted run's weights."""
    once = tmp_path / "fired"
    values = overrides(data_dir, tmp_path / "run", **fault(kill_step=3, kill_signal="STOP", rank=1, once_file=once))
    job, log = sbatch(slurm_cluster, tmp_path, values)
    try:
        timeline = take_node_away(slurm_cluster, once, job, log, "node lost")

        def requeued():
            info = timeline.observe()
            return info.get("Restarts") == "1" and info.get("JobState") == "PENDING"

        wait_for(requeued, 120, "the job to be requeued", log=log)
        slurm_cluster.start_node(2)
        timeline.mark("n2 back")
        info = wait_job_end(job, log, timeline=timeline)
    finally:
        slurm_cluster.start_node(2)
        slurm_cluster.wait_nodes_idle()
    timeline.show()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log.read_text()[-3000:]
    text = log.read_text()
    assert re.search("Connection (closed|reset) by peer", text)  # the survivor did not hang: its collective failed
    resumed = f"resuming from {tmp_path / 'run' / 'checkpoint-2'}"
    assert resumed in text, text[-3000:]  # steps lost: 3 - 2 = 1 <= save interval
    assert losses(tmp_path / "run") == losses(two_nodes["run"])
    assert_same_weights(two_nodes["run"], tmp_path / "run")


def test_requeue_on_fewer_nodes_continues_the_two_process_checkpoint(two_nodes, slurm_cluster, data_dir, tmp_path):
    """Submitted with `--nodes=1-2` and `fit_global_batch`: n2 is lost after step 3 and stays down; the requeued job
    starts on n1 alone, one process with 2 accumulation steps (the same global batch of 4), continues from the
    2-process checkpoint-2 and ends within rel 1e-4 of the uninterrupted 2-node losses."""
    once = tmp_path / "fired"
    values = overrides(data_dir, tmp_path / "run", fit_global_batch="true",
                       **fault(kill_step=3, kill_signal="STOP", rank=1, once_file=once))  # fmt: skip
    job, log = sbatch(slurm_cluster, tmp_path, values, nodes="1-2")
    try:
        timeline = take_node_away(slurm_cluster, once, job, log, "node lost, back on 1 node")
        info = wait_job_end(job, log, timeline=timeline)
    finally:
        slurm_cluster.start_node(2)
        slurm_cluster.wait_nodes_idle()
    timeline.show()
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1" and info["NodeList"] == "n1", text[-3000:]
    assert f"job {job} on n[1-2], restart 0" in text and f"job {job} on n1, restart 1" in text
    assert f"resuming from {tmp_path / 'run' / 'checkpoint-2'}" in text
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["world_size"] == 1
    got, ref = losses(tmp_path / "run"), losses(two_nodes["run"])
    assert sorted(got) == sorted(ref)
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-4)


def test_hung_rank_fails_the_others_within_the_collective_timeout(slurm_cluster, data_dir, tmp_path):
    """Rank 1 is stopped (SIGSTOP) after step 3: its sockets stay open, so only the collective timeout can tell.
    Rank 0 fails after `ddp_timeout` (10 s here) in its next collective, srun's --kill-on-bad-exit ends the stopped
    rank, the job fails and both nodes are free again: nothing hangs past the timeout."""
    once = tmp_path / "fired"
    values = overrides(data_dir, tmp_path / "run", ddp_timeout=DDP_TIMEOUT_S,
                       **fault(kill_step=3, kill_signal="STOP", rank=1, once_file=once))  # fmt: skip
    job, log = sbatch(slurm_cluster, tmp_path, values)
    wait_for(once.exists, 120, "rank 1 to reach step 3", log=log)
    timeline = Timeline("hung rank", slurm_cluster, job, log)
    info = wait_job_end(job, log, timeout=DDP_TIMEOUT_S + 60, timeline=timeline)
    slurm_cluster.wait_nodes_idle(timeout=30)  # the stopped process is gone with its step
    timeline.show()
    text = log.read_text()
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", text[-3000:]
    assert f"Timed out waiting {DDP_TIMEOUT_S * 1000}ms" in text  # the survivor's own collective timeout ended it


def test_preemption_reaches_every_rank_and_resumes_bit_exact(two_nodes, slurm_cluster, data_dir, tmp_path):
    """Slurm signals the batch shell (as `--signal=B:USR1@120` does before the time limit) after step 2; the script
    relays USR1 to every task on every node, each rank reports it, all agree to save checkpoint-3 and exit 0, the job
    requeues itself and the restart resumes from checkpoint-3 to the uninterrupted run's weights."""
    once = tmp_path / "fired"
    values = overrides(data_dir, tmp_path / "run", **fault(kill_step=2, kill_signal="SLURM", once_file=once))
    job, log = sbatch(slurm_cluster, tmp_path, values)
    wait_for(once.exists, 120, "rank 0 to reach step 2 (and ask Slurm for USR1)", log=log)
    timeline = Timeline("pre-emption", slurm_cluster, job, log)
    info = wait_job_end(job, log, timeline=timeline)
    timeline.show()
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", text[-3000:]
    assert "rank 0 on n1: SIGUSR1 received" in text and "rank 1 on n2: SIGUSR1 received" in text
    assert "requeueing job" in text and f"resuming from {tmp_path / 'run' / 'checkpoint-3'}" in text
    assert losses(tmp_path / "run") == losses(two_nodes["run"])
    assert_same_weights(two_nodes["run"], tmp_path / "run")


def test_fewer_nodes_without_fit_global_batch_is_only_the_refusal(slurm_cluster, data_dir, tmp_path):
    """Issue 32: a job that comes back on fewer nodes (here: started on one) without `fit_global_batch` cannot keep
    the global batch of 4 with 2 per process: the log holds the one `error:` line naming the fix and no launcher
    traceback after it."""
    job, log = sbatch(slurm_cluster, tmp_path, overrides(data_dir, tmp_path / "run"), nodes="1")
    info = wait_job_end(job, log)
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("error: ")]
    assert info["JobState"] == "FAILED", text[-3000:]
    assert len(errors) == 1 and "global batch mismatch" in errors[0], text[-3000:]
    assert "Traceback" not in text and "CalledProcessError" not in text, text[-3000:]
    assert not (tmp_path / "run" / "manifest.json").exists()
