"""The end-to-end half of tests/unit/core/test_first_hour_errors.py (issue 42, "the first hour, again"): what needs a
process of its own: a script started by a Python without the project, and Ctrl-C during training."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_started_outside_the_venv_says_to_activate_it(script, tmp_path):
    """`python3 scripts/sft.py ...` with the system Python (no project, no torch): one line naming the interpreter and
    what to run instead, exit 2; was a ModuleNotFoundError traceback. `-S` leaves out site-packages, where the
    project's editable install lives, as a Python without it would."""
    done = subprocess.run(
        [sys.executable, "-S", str(ROOT / "scripts" / script), "--help"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert lines[0].startswith(f"error: {sys.executable} cannot import instella_recipes")
    assert ". .venv/bin/activate first" in lines[0] and "make setup" in lines[0]


def _wait_for(path: Path, text: str, process: subprocess.Popen, limit_s: float = 300) -> None:
    """Until `text` appears in the file at `path` (the run's log), the run ends, or `limit_s` passes."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and process.poll() is None:
        if path.is_file() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{text!r} never appeared in {path}:\n{path.read_text(errors='replace')[-3000:]}")


@pytest.mark.usefixtures("one_thread")
def test_ctrl_c_during_training_is_one_line_exit_130_and_nothing_complete(tmp_path):
    """SIGINT (what Ctrl-C sends) after the first logged step: exit 130, one `error:` line, no traceback, no
    manifest; the same command then resumes (here: starts again, no checkpoint was saved yet) and completes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    prepare = [sys.executable, str(ROOT / "scripts/prepare_data.py"), "--config", "recipes/tiny/prepare_data.yaml"]
    subprocess.run([*prepare, "--output_dir", str(tmp_path / "prepare")], cwd=ROOT, check=True, env=env, timeout=600,
                   capture_output=True)  # fmt: skip
    out = tmp_path / "stage1"
    train = [sys.executable, str(ROOT / "scripts/pretrain.py"), "--config", "recipes/tiny/pretrain_stage1.yaml",
             "--data_dir", str(tmp_path / "prepare"), "--output_dir", str(out), "--logging_steps", "1",
             "--report_to", "none"]  # fmt: skip
    log = tmp_path / "train.log"
    with log.open("w") as sink:
        process = subprocess.Popen([*train, "--max_steps", "10000"], cwd=ROOT, env=env, stdout=sink, stderr=sink)
        try:
            _wait_for(log, "'loss'", process)
            process.send_signal(signal.SIGINT)
            process.wait(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
    text = log.read_text(errors="replace")
    errors = [line for line in text.splitlines() if "error: " in line]
    assert process.returncode == 130 and "Traceback" not in text, text[-3000:]
    assert len(errors) == 1 and "interrupted (Ctrl-C): nothing was marked complete" in errors[0], errors
    assert not (out / "manifest.json").exists()
    again = subprocess.run([*train, "--max_steps", "2"], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "manifest.json").is_file()
