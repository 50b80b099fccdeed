"""The pipeline's Slurm executor on a real Slurm (the run's private cluster, tests/helpers/slurm_cluster.py: slurmctld
and two nodes, each a slurmd with its own munged): stages as dependent sbatch jobs, a failed stage cancelling its
dependents, a pre-empted training requeued by Slurm and resumed to the same weights as an uninterrupted run, and
2-process training (srun, gloo) matching 1 process. Where no cluster can start (no root, no slurm-wlm) these tests skip
with the reason; the dry-run test needs none. Multi-node runs and node faults: test_slurm_multinode.py."""

import json
import os
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from instella_recipes.core import RecipeError
from instella_recipes.pipeline.cli import main
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.pipeline.slurm import resources
from instella_recipes.pretraining.pretrain import main as pretrain_main
from tests.helpers.pretrain_utils import pretrain_argv, resume_on_one_process

ROOT = Path(__file__).resolve().parents[2]


def needs_slurm(test):
    """On the run's private cluster (tests/helpers/slurm_cluster.py); skipped with the reason where none can start."""
    return pytest.mark.slurm(pytest.mark.usefixtures("slurm_cluster")(test))


pytestmark = pytest.mark.usefixtures("one_thread")
ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="module")
def data_dir(tiny_pretrain_data):
    return tiny_pretrain_data  # the data of tiny_pretrain_reference (tests/e2e/conftest.py)


def _pipeline(tmp_path, stages, **top) -> Path:
    path = tmp_path / "pipeline.yaml"
    path.write_text("# CPU, test pipeline\n" + yaml.safe_dump({"output_dir": str(tmp_path / "run"), **top,
                                                               "stages": stages}, sort_keys=False))  # fmt: skip
    return path


def _pretrain_args(data_dir, **overrides) -> dict:
    argv = pretrain_argv(data_dir, "{output}", **overrides)
    return {argv[i][2:]: argv[i + 1] for i in range(0, len(argv), 2)}


def _weights(folder):
    return load_file(Path(folder) / "model.safetensors")


def _losses(folder):
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def test_dry_run_prints_dependent_sbatch_scripts_with_resources(tmp_path, capsys):
    """No Slurm needed: the scripts chain stage jobs with afterok, carry the YAML's resources and CLI overrides."""
    path = _pipeline(
        tmp_path,
        [{"name": "a", "command": "python -c pass", "writes_manifest": False},
         {"name": "b", "command": "python -c pass", "writes_manifest": False, "inputs": ["a"],
          "slurm": {"nodes": 2, "gpus_per_node": 8, "preempt_signal_s": 120}}],
        slurm={"time": "01:00:00", "partition": "gpu"},
    )  # fmt: skip
    argv = ["--config", str(path), "--executor", "slurm", "--dry_run", "--slurm", "b.account=proj", "--slurm",
            "cpus_per_task=4"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    a, b = out.split("# ---- [2/2]")
    assert "#SBATCH --dependency" not in a and "#SBATCH --time=01:00:00" in a and "#SBATCH --partition=gpu" in a
    assert "#SBATCH --dependency=afterok:<a>" in b and "#SBATCH --kill-on-invalid-dep=yes" in b
    for line in ("--nodes=2", "--gpus-per-node=8", "--signal=B:USR1@120", "--requeue", "--account=proj",
                 "--cpus-per-task=4"):  # fmt: skip
        assert f"#SBATCH {line}\n" in b
    assert "--account=proj" not in a


def test_bad_slurm_settings_are_named(tmp_path):
    path = _pipeline(tmp_path, [{"name": "a", "command": "python -c pass", "slurm": {"gpu_per_node": 8}}])
    with pytest.raises(RecipeError, match=r"pipeline.yaml:\d+: unknown slurm key 'gpu_per_node'.*gpus_per_node"):
        load_pipeline(path)
    path = _pipeline(tmp_path, [{"name": "a", "command": "python -c pass", "slurm": {"time": "1:00:00"}}])
    pipeline = load_pipeline(path)
    with pytest.raises(RecipeError, match="--slurm tme=5"):
        resources(pipeline, pipeline.stages[0], ["tme=5"])
    yaml_time = _pipeline(tmp_path, [{"name": "a", "command": "python -c pass"}])
    yaml_time.write_text(yaml_time.read_text().replace("stages:", "slurm: {time: 48:00:00}\nstages:"))
    pipeline = load_pipeline(yaml_time)
    with pytest.raises(RecipeError, match="must be a quoted string"):
        resources(pipeline, pipeline.stages[0], [])


@needs_slurm
def test_failed_stage_cancels_its_dependents_and_is_named(tmp_path, capsys):
    path = _pipeline(
        tmp_path,
        [{"name": "ok", "command": "python -c pass", "writes_manifest": False},
         {"name": "bad", "command": "python -c 'import sys; sys.exit(3)'", "inputs": ["ok"], "writes_manifest": False},
         {"name": "after", "command": "python -c pass", "inputs": ["bad"], "writes_manifest": False}],
    )  # fmt: skip
    assert main(["--config", str(path), "--executor", "slurm", "--wait"]) == 1
    err = capsys.readouterr().err
    assert "stage 'bad' failed" in err and str(tmp_path / "run" / "logs" / "bad.log") in err
    assert "cancelled because an input failed: after" in err
    assert "exited with code 3" in (tmp_path / "run" / "logs" / "bad.slurm.log").read_text()
    assert (tmp_path / "run" / "ok" / "manifest.json").is_file() and not (tmp_path / "run" / "after").exists()


@needs_slurm
def test_tiny_pipeline_through_slurm_then_resubmission_skips(tmp_path, capsys):
    """The whole tiny pipeline (18 stages: training chain, evaluations, draft, speculative decoding, release,
    report) as dependent jobs, stage 2's three seeds side by side; then a second submission finds every stage
    complete and submits nothing."""
    small = ["hidden_size=32", "intermediate_size=64", "num_layers=2", "stage1_epochs=1", "stage2_steps=2",
             "n_train_problems=60"]  # fmt: skip
    argv = ["--config", "recipes/tiny/pipeline.yaml", "--output_dir", str(tmp_path / "demo"), "--executor", "slurm"]
    argv += [item for s in small for item in ("--set", s)]
    # on n1 only: its 2 CPUs run two jobs at a time on the machine's 2 cores; both nodes would run four
    argv += ["--slurm", "sbatch_args=--nodelist=n1"]
    assert main([*argv, "--wait"]) == 0
    out = capsys.readouterr().out
    assert "stage2_6198: submitted job" in out and "after stage1, prepare" in out
    merged = _weights(tmp_path / "demo" / "merge")
    seeds = [_weights(tmp_path / "demo" / f"stage2_{s}") for s in (5796, 6198, 8915)]
    key = "model.embed_tokens.weight"
    assert torch.allclose(merged[key], sum(s[key] for s in seeds) / 3, atol=1e-6)
    assert (tmp_path / "demo" / "report.md").is_file() and (tmp_path / "demo" / "release" / "manifest.json").is_file()
    assert main(argv) == 0
    assert "nothing to submit" in capsys.readouterr().out


@needs_slurm
def test_preempted_training_is_requeued_and_ends_bit_exact(tmp_path, data_dir, tiny_pretrain_reference, capsys):
    """Slurm sends USR1 to the batch shell at step 3 (as at `--signal=B:USR1@s` before the time limit): the run
    saves a checkpoint and exits 0, the job requeues itself, restarts (SLURM_RESTART_COUNT=1) and resumes."""
    reference = tiny_pretrain_reference  # the same command, uninterrupted
    args = _pretrain_args(data_dir, max_steps=8, save_steps=100)
    args.update(
        plugins="instella_recipes.pretraining.fault_injection:kill_at_step",
        plugin_args=json.dumps({"kill_step": 3, "kill_signal": "SLURM", "once_file": str(tmp_path / "once")}),
    )
    stage = {"name": "train", "command": "scripts/pretrain.py", "args": args, "slurm": {"preempt_signal_s": 60}}
    path = _pipeline(tmp_path, [stage], env=ENV)  # fmt: skip
    assert main(["--config", str(path), "--executor", "slurm", "--wait"]) == 0
    batch_log = (tmp_path / "run" / "logs" / "train.slurm.log").read_text()
    assert "USR1" in batch_log and "requeueing" in batch_log and "restart 1" in batch_log, batch_log
    run = tmp_path / "run" / "train"
    assert json.loads((tmp_path / "run" / "pipeline" / "train.json").read_text())["resumed"] is True
    assert _losses(run) == _losses(reference)
    ref, got = _weights(reference), _weights(run)
    assert all(torch.equal(ref[k], got[k]) for k in ref)


@needs_slurm
def test_two_processes_under_srun_match_one_and_resume_on_one(tmp_path, data_dir):
    """accelerate_configs/cpu_2proc_srun.yaml under `srun` (2 tasks, gloo): the run sees world size 2; its losses
    match a 1-process run of the same global batch (4 = 2 x 2 processes = 2 x 2 accumulation);
    its checkpoint resumes on 1."""
    args = _pretrain_args(data_dir, max_steps=4, save_steps=2, per_device_train_batch_size=2)
    config = "accelerate_configs/cpu_2proc_srun.yaml"
    stage = {"name": "ddp", "command": "scripts/pretrain.py", "accelerate_config": config,
             "args": args, "slurm": {"ntasks_per_node": 2}}  # fmt: skip
    path = _pipeline(tmp_path, [stage], env=ENV)
    assert main(["--config", str(path), "--executor", "slurm", "--wait"]) == 0
    two = tmp_path / "run" / "ddp"
    manifest = json.loads((two / "manifest.json").read_text())
    assert manifest["world_size"] == 2 and (two / "checkpoint-2" / "rng_state_1.pth").is_file()

    one = tmp_path / "one"
    resume_on_one_process(data_dir, two, one)  # the 2-process checkpoint resumes on 1 process
    reference = tmp_path / "reference"
    assert pretrain_main(pretrain_argv(data_dir, reference, max_steps=4, save_steps=100,
                                       per_device_train_batch_size=2, gradient_accumulation_steps=2)) == 0  # fmt: skip
    losses_two, losses_one, losses_ref = _losses(two), _losses(one), _losses(reference)
    # gloo all-reduce vs. accumulation: the same samples, summed in another order -> equal to rounding
    for step in (1, 2, 3, 4):
        assert losses_two[step] == pytest.approx(losses_ref[step], rel=1e-4)
    for step in (3, 4):
        assert losses_one[step] == pytest.approx(losses_two[step], rel=1e-4)
    a, b = _weights(two), _weights(reference)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)


def test_a_node_whose_slurmd_alone_died_comes_back_whole(slurm_cluster):
    """Issue 32: only n2's slurmd is killed (its munged lives on). `start-node 2` ends what is left of the node first,
    so after it the node has exactly one munged, the one its pid file names, and the old one is gone (a second one was
    started before and the first ran on untracked, outliving even `stop`)."""
    import signal

    node = slurm_cluster.folder / "n2"
    old_munged = int((node / "munged.pid").read_text())
    os.kill(int((node / "slurmd.pid").read_text()), signal.SIGKILL)
    try:
        out = slurm_cluster.script("start-node", "2")
        assert "slurmd is gone; ending what is left of the node" in out, out
        new_munged = int((node / "munged.pid").read_text())
        assert new_munged != old_munged and not _running(old_munged)
        namespace = (node / "namespace").read_text().strip()
        munged = [p.name for p in Path("/proc").glob("[0-9]*") if _uts(p) == namespace and _comm(p) == "munged"]
        munged = [pid for pid in munged if _running(int(pid))]
        assert munged == [str(new_munged)]
        assert "n2: munged running" in slurm_cluster.script("status")
    finally:
        slurm_cluster.start_node(2)
        slurm_cluster.wait_nodes_idle()


def _uts(proc: Path) -> str | None:
    try:
        return os.readlink(proc / "ns" / "uts")
    except OSError:
        return None


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (killed, not yet reaped by its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_evaluation_stages_ask_for_the_gpus_they_use(tmp_path):
    """An evaluation stage's job asks for its own GPUs (vLLM: tensor x data parallel; hf through accelerate: the
    config's processes) instead of the training stages' default; a stage's own `slurm.gpus_per_node` wins."""
    ddp = tmp_path / "ddp.yaml"
    ddp.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\n")
    vllm_args = {"model": "vllm", "model_args": "pretrained=m,tensor_parallel_size=2,data_parallel_size=4"}
    path = _pipeline(
        tmp_path,
        [{"name": "train", "command": "python -c pass"},
         {"name": "eval_vllm", "command": "lm_eval", "args": vllm_args},
         {"name": "eval_dp", "command": "lm_eval", "accelerate_config": str(ddp), "args": {"model": "hf"}},
         {"name": "eval_one", "command": "lm_eval", "args": {"model": "hf"}},
         {"name": "eval_pinned", "command": "lm_eval", "args": vllm_args, "slurm": {"gpus_per_node": 1}}],
        slurm={"gpus_per_node": 8},
    )  # fmt: skip
    pipeline = load_pipeline(path)
    gpus = {s.name: resources(pipeline, s, [])["gpus_per_node"] for s in pipeline.stages}
    assert gpus == {"train": 8, "eval_vllm": 8, "eval_dp": 4, "eval_one": 1, "eval_pinned": 1}
    assert pipeline.stage("eval_dp").resolved.argv[1:6] == ["launch", "--config_file", str(ddp), "-m", "lm_eval"]
    cpu = load_pipeline(_pipeline(tmp_path, [{"name": "e", "command": "lm_eval", "args": {"model": "hf"}}]))
    assert resources(cpu, cpu.stages[0], []).get("gpus_per_node") is None  # a CPU pipeline asks for no GPU
