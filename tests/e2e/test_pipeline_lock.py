"""The end-to-end half of tests/unit/pipeline/test_pipeline.py: a second pipeline run on a stage folder that a running
pipeline (a subprocess) holds stops with one line naming who holds it."""

import pytest

from instella_recipes.pipeline.cli import main
from tests.unit.pipeline.test_pipeline import _alive, _start_runner, _wait_until


def test_a_second_run_on_a_locked_stage_folder_says_who_holds_it(tmp_path, capsys):
    import os
    import socket

    graph, runner, pids = _start_runner(tmp_path, "pids")
    try:
        with pytest.raises(SystemExit, match="2"):
            main(["--config", str(graph)])
        err = capsys.readouterr().err
        assert f"is being written by another run (pid {runner.pid} on host {socket.gethostname()}" in err
        assert "slow.lock" in err
    finally:
        runner.terminate()
        runner.communicate(timeout=60)
    assert _wait_until(lambda: not any(_alive(pid) for pid in pids))
    assert not os.path.exists(tmp_path / "run" / "slow.lock")  # the runner removes its lock when it stops
