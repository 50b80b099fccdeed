"""The end-to-end half of tests/unit/trainer/test_preemption.py
(processes, whole runs, oracles); the in-process tests are there.

Issue 24.9: SIGTERM at every phase of an SFT, DPO or pretraining run ends it with exit 0 in a consistent state:
during start-up (imports, tokenizer, dataset map, model load) with nothing written, during training with a checkpoint
and no manifest (the next run resumes from it and finishes), during the final save after that save (manifest).

The process signals itself at the phase, through a wrapper around the phase's function or the fault-injection
callbacks (instella_recipes/pretraining/fault_injection.py), so the moment is exact; the import phase is hit from
outside, as soon as the entry point has its handler in place (seen in /proc/<pid>/status)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.pretrain_utils import pretrain_argv
from tests.unit.trainer import test_preemption as unit_half  # fixtures and helpers both halves use

RECIPES, ROOT, SMALL, _argv, data_dir = (
    unit_half.RECIPES,
    unit_half.ROOT,
    unit_half.SMALL,
    unit_half._argv,
    unit_half.data_dir,
)
pytestmark = pytest.mark.usefixtures("one_thread")


def _handles(pid: int, sig: int) -> bool:
    """The process has a handler for `sig` (SigCgt in /proc/<pid>/status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (sig - 1) & 1)


def _has_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def test_sigterm_while_an_entry_point_imports_exits_zero_with_nothing_written(tiny_model_dir, data_dir, tmp_path):
    """SIGTERM the moment each entry point has its handler, before it has even loaded torch (its imports take
    seconds; before this fix, a SIGTERM then ended it with -15). The three run at once."""
    runs = {
        "pretrain": pretrain_argv(data_dir, tmp_path / "pretrain", max_steps=2),
        "sft": _argv("sft", tiny_model_dir, tmp_path / "sft"),
        "dpo": _argv("dpo", tiny_model_dir, tmp_path / "dpo"),
    }
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    procs = {
        name: subprocess.Popen(
            [sys.executable, f"scripts/{name}.py", *argv],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name, argv in runs.items()
    }
    waiting, early, deadline = dict(procs), {}, time.monotonic() + 60
    while waiting and time.monotonic() < deadline:
        for name, proc in list(waiting.items()):
            if _handles(proc.pid, signal.SIGTERM) or proc.poll() is not None:
                early[name] = proc.poll() is None and not _has_torch(proc.pid)
                proc.send_signal(signal.SIGTERM)
                del waiting[name]
        time.sleep(0.002)
    assert not waiting, f"no SIGTERM handler within 60 s: {list(waiting)}"
    for name, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert early[name], f"{name}: torch was imported before the handler was in place"
        assert proc.returncode == 0, f"{name}: {err[-2000:]}"
        assert "pre-empted during start-up (before loading anything)" in err, f"{name}: {err[-2000:]}"
        assert not (tmp_path / name).exists()


@pytest.mark.parametrize("stage", ["sft", "dpo"])
@pytest.mark.parametrize("phase", ["train", "end"])
def test_sigterm_while_post_training_trains_or_saves_exits_zero_consistently(
    stage, phase, tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """The unit half's start-up phases, here for training (checkpoint, no manifest; the next run finishes it) and the
    final save (manifest)."""
    unit_half.sigterm_at(stage, phase, tiny_model_dir, tmp_path, monkeypatch, caplog)
