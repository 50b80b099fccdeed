"""`prepare_data --layout olmo --executor slurm --tasks 2` on the run's private 2-node Slurm
(tests/helpers/slurm_cluster.py): datatrove submits the groups as a 2-element job array, each element a whole node
(`num_proc` = the node's CPUs), and the finishing job afterok the array; the output is byte for byte the one-process
run's."""

import os
import subprocess

import pytest

from instella_recipes.data.prepare import main as prepare_main
from tests.e2e.test_token_tasks import snapshot, two_source_argv
from tests.unit.data.test_dolma_tokens import write_documents

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm_cluster")]


def _array_nodes(job: str) -> set[str]:
    """The nodes the elements of array job `job` ran on (the controller keeps finished jobs for MinJobAge)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", job, "-o", "%i %N"], capture_output=True, text=True)
    return {line.split()[1] for line in out.stdout.splitlines() if len(line.split()) == 2}


def test_two_nodes_write_the_one_process_bytes(slurm_cluster, tmp_path, capsys, monkeypatch):
    write_documents(tmp_path / "docs", seed=1)
    write_documents(tmp_path / "more", seed=2)
    assert prepare_main(two_source_argv(tmp_path, tmp_path / "one")) == 0
    slurm_cluster.wait_nodes_idle()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "two"
    argv = two_source_argv(tmp_path, out, "--executor", "slurm", "--tasks", "2", "--num_proc", str(os.cpu_count()))
    assert prepare_main([*argv, "--wait", "true"]) == 0  # submits, then waits for the finishing job
    run = next((tmp_path / "two.tasks").glob("*/slurm_jobs.json")).parent
    logs = "\n".join(p.read_text()[-2000:] for p in run.rglob("*.out"))
    assert (out / "manifest.json").is_file(), logs
    assert snapshot(out) == snapshot(tmp_path / "one")
    jobs = (run / "slurm_jobs.json").read_text()
    tasks_job = jobs.split('"tasks": "')[1].split('"')[0]
    assert _array_nodes(tasks_job) == {"n1", "n2"}, logs
    capsys.readouterr()
    assert prepare_main([*argv, "--status", "true"]) == 0
    status = capsys.readouterr().out
    assert "2 of 2 tasks done; not done: none" in status and f"{out}: complete" in status
