"""The end-to-end half of tests/unit/pipeline/test_pipeline.py
(processes, whole runs, oracles); the in-process tests are there.

The pipeline engine (`scripts/pipeline.py`, `instella_recipes/pipeline/`) on cheap dummy stages: order, matrix
expansion,
skip-when-complete, re-run of changed stages and their dependents, failures naming the stage and its log, and
`--stage` checking its inputs first."""

import json

import pytest

from instella_recipes.pipeline.cli import main
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.pipeline.runner import read_record, stage_status
from tests.unit.pipeline import test_pipeline as unit_half  # fixtures and helpers both halves use

DUMMY, GRAPH, SLEEPER, _alive, _default_sigint, _start_runner, _wait_until, graph, journal, write_pipeline = (
    unit_half.DUMMY,
    unit_half.GRAPH,
    unit_half.SLEEPER,
    unit_half._alive,
    unit_half._default_sigint,
    unit_half._start_runner,
    unit_half._wait_until,
    unit_half.graph,
    unit_half.journal,
    unit_half.write_pipeline,
)


def test_runs_in_order_then_skips_complete_and_redoes_changed(graph, tmp_path, capsys):
    assert main(["--config", str(graph)]) == 0
    order = ["data", "stage2_11", "stage2_22", "stage2_33", "merge", "sft", "report"]
    assert journal(tmp_path) == order
    run = tmp_path / "run"
    for name in order:
        assert (run / name / "manifest.json").is_file()
        assert (run / "logs" / f"{name}.log").read_text().count(f"stage {name} working") == 1
        record = read_record(load_pipeline(graph).stage(name))
        assert record["status"] == "done" and record["wall_s"] >= 0 and record["cpu_s"] >= 0
    # the pipeline wrote the manifest of the stage that writes none (report), naming its inputs
    assert json.loads((run / "report" / "manifest.json").read_text())["inputs"]["sft"] == str(run / "sft")
    assert not list(run.glob("*.lock"))  # each stage's lock is removed when the stage is over

    assert main(["--config", str(graph)]) == 0  # everything complete: nothing runs
    assert journal(tmp_path) == order
    assert "7 skipped" in capsys.readouterr().out

    # a changed argument re-runs that stage and everything downstream of it, nothing upstream
    assert main(["--config", str(graph), "--set", "value=2"]) == 0
    assert journal(tmp_path) == order + ["merge", "sft", "report"]
    assert (run / "merge" / "value.txt").read_text() == "2"

    # a stage output deleted by hand is made again, and its dependents follow
    (run / "stage2_22" / "manifest.json").unlink()
    assert main(["--config", str(graph), "--set", "value=2"]) == 0
    assert journal(tmp_path)[-4:] == ["stage2_22", "merge", "sft", "report"]


def test_changed_recipe_file_reruns_the_stage(graph, tmp_path):
    assert main(["--config", str(graph)]) == 0
    (tmp_path / "recipe.yaml").write_text("# dummy recipe\nvalue: 2\nmodel: {hidden: 64, layers: 2}\n")
    pipeline = load_pipeline(graph)
    assert stage_status(pipeline, pipeline.stage("data")) == "stale"
    assert main(["--config", str(graph)]) == 0
    assert journal(tmp_path).count("data") == 2 and journal(tmp_path).count("sft") == 2


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL"])
def test_stage_processes_die_with_the_runner(tmp_path, signame):
    """Issue 13.2: the stage and the processes it started stop when the runner is signalled or killed."""
    import signal

    _graph, runner, pids = _start_runner(tmp_path, "pids")
    runner.send_signal(getattr(signal, signame))
    runner.communicate(timeout=60)
    assert _wait_until(lambda: not any(_alive(pid) for pid in pids)), f"left running after {signame}: {pids}"
    if signame != "SIGKILL":  # the runner stopped the stage's whole process group and said how to resume
        assert runner.returncode == 128 + getattr(signal, signame)
