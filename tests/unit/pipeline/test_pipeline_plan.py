"""`--dry_run` shows what the run will do: after a `--set` change, the stage it touches and every stage downstream
(complete now, re-run because an input re-runs), and the run then runs exactly those; each run record keeps the
`--set` it ran with. Uses the dummy stages of test_pipeline.py."""

import re

import pytest

from instella_recipes.pipeline.cli import main
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.pipeline.runner import read_record
from tests.unit.pipeline import test_pipeline as base


@pytest.fixture
def graph(tmp_path):
    return base.write_pipeline(tmp_path, base.GRAPH.replace("OUT", str(tmp_path / "run")))


def planned(out: str) -> list[str]:
    return re.findall(r"^# (\S+): \w+ -> runs", out, re.M)


def test_dry_run_after_a_set_change_lists_what_the_run_then_runs(graph, tmp_path, capsys):
    assert main(["--config", str(graph)]) == 0
    capsys.readouterr()
    assert main(["--config", str(graph), "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert planned(out) == [] and "# would run 0 of 7 stage(s)" in out

    assert main(["--config", str(graph), "--set", "value=2", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert planned(out) == ["merge", "sft", "report"]  # merge uses {value}; sft and report are downstream of it
    assert "# merge: stale -> runs (its recipe, arguments or inputs changed)" in out
    assert "# sft: complete -> runs (input merge runs first)" in out
    assert "# data: complete -> skipped" in out and "# would run 3 of 7 stage(s): merge, sft, report" in out

    before = len(base.journal(tmp_path))
    assert main(["--config", str(graph), "--set", "value=2"]) == 0
    assert base.journal(tmp_path)[before:] == ["merge", "sft", "report"]  # exactly what the dry run said
    pipeline = load_pipeline(graph)
    assert read_record(pipeline.stage("merge"))["set"] == {"value": 2}
    assert read_record(pipeline.stage("data"))["set"] == {}  # made before, without --set


def test_dry_run_with_force_and_with_a_stage(graph, tmp_path, capsys):
    assert main(["--config", str(graph), "--dry_run"]) == 0
    everything = ["data", "stage2_11", "stage2_22", "stage2_33", "merge", "sft", "report"]
    assert planned(capsys.readouterr().out) == everything
    assert main(["--config", str(graph)]) == 0
    capsys.readouterr()
    assert main(["--config", str(graph), "--stage", "merge", "--force", "--dry_run"]) == 0
    assert planned(capsys.readouterr().out) == ["merge"]  # --stage runs only the selection


def test_slurm_dry_run_after_a_set_change_submits_the_dependents_too(graph, tmp_path, capsys):
    """The Slurm executor decides the same way: a complete stage whose input gets a job gets one too (no Slurm is
    needed for --dry_run: it prints the sbatch scripts)."""
    assert main(["--config", str(graph)]) == 0
    capsys.readouterr()
    assert main(["--config", str(graph), "--set", "value=2", "--executor", "slurm", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert re.findall(r"^# ---- \[\d+/7\] (\S+):", out, re.M) == ["merge", "sft", "report"]
    assert "data: complete, skipped" in out
