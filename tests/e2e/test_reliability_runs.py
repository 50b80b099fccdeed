"""The end-to-end half of tests/unit/core/test_reliability.py
(processes, whole runs, oracles); the in-process tests are there.

Issue 13: no silent success. Non-finite input weights are refused (naming the tensor) before training, merging
or converting; a run whose every step was skipped fails; a run that died before its first checkpoint does not pin
its folder; a damaged newest checkpoint falls back to the previous complete one."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from instella_recipes.core import read_manifest, write_manifest
from instella_recipes.pretraining.pretrain import main as pretrain_main
from tests.helpers.argv import overriding
from tests.helpers.pretrain_utils import pretrain_argv
from tests.unit.core import test_reliability as unit_half  # fixtures and helpers both halves use

CHAT, data_dir, post_world = unit_half.CHAT, unit_half.data_dir, unit_half.post_world
pytestmark = pytest.mark.usefixtures("one_thread")


def sft_argv(world, out, *extra, source=None) -> list[str]:
    return overriding(["--model_name_or_path", str(world / "model"), "--output_dir", str(out),
            "--sources", str(source or world / "chat.jsonl"), "--max_length", "64",
            "--per_device_train_batch_size", "2", "--learning_rate", "1e-3", "--report_to", "none",
            "--use_cpu", "true", "--bf16", "false", "--torch_num_threads", "1", "--max_steps", "2"],
            list(extra))  # fmt: skip


def test_overwrite_replaces_a_complete_output_of_another_stage_from_scratch(post_world, data_dir, tmp_path, capsys):
    """SFT pointed at a complete pretrain folder: refused without --overwrite (the folder untouched); with it, the
    folder is emptied first, so its checkpoint-2 is not resumed and the manifest says what really ran."""
    from instella_recipes.post_training.sft import main as sft_main

    out = tmp_path / "run"
    assert pretrain_main(pretrain_argv(data_dir, out, max_steps=2, save_steps=2)) == 0
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit) as exc:
        sft_main(sft_argv(post_world, out))
    assert exc.value.code == 2 and "holds a complete 'pretrain' output" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == before and read_manifest(out)["stage"] == "pretrain"
    sft_main(sft_argv(post_world, out, "--overwrite", "true", "--max_steps", "3"))
    manifest = read_manifest(out)
    assert manifest["stage"] == "sft" and manifest["global_step"] == 3
    assert not (out / "checkpoint-2").exists()  # nothing of the pretrain run: its run.json is the SFT run's
    assert json.loads((out / "run.json").read_text())["fingerprint"] == manifest["run"]["fingerprint"]


def test_sigkill_while_sft_overwrites_a_complete_folder_leaves_no_manifest(post_world, tmp_path):
    """The old manifest goes before the first byte of the new run: killed as soon as the new run has written
    anything (its first checkpoint), the folder holds new files and no manifest."""
    out = tmp_path / "sft"
    shutil.copytree(post_world / "model", out)
    write_manifest(out, "sft")
    argv = sft_argv(post_world, out, "--overwrite", "true", "--max_steps", "200", "--save_strategy", "steps",
                    "--save_steps", "1")  # fmt: skip
    code = f"from instella_recipes.post_training.sft import main; main({argv!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while not list(out.glob("checkpoint-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(out.glob("checkpoint-*")), proc.stderr.read().decode()[-3000:] if proc.poll() else "too slow"
    finally:
        proc.kill()
        proc.wait()
    assert not (out / "manifest.json").exists()


# Failures of the machine: a real full disk (a small tmpfs in a private mount namespace), a real permission denial
# (a mode-000 file read by an unprivileged user). Each: exit 1, one `error:` line naming the path and the cause, no
# traceback, nothing complete-looking.
def _unshare_prefix() -> list[str] | None:
    """How to mount a private tmpfs here: `unshare -m` as root, a user namespace otherwise; None if neither works."""
    if shutil.which("unshare") is None:
        return None
    prefix = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-Urm"]
    probe = subprocess.run([*prefix, "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt || mount -t tmpfs tmpfs /tmp"],
                           capture_output=True)  # fmt: skip
    return prefix if probe.returncode == 0 else None


UNSHARE = _unshare_prefix()


needs_tmpfs = pytest.mark.skipif(UNSHARE is None, reason="cannot mount a private tmpfs here (no unshare/mount rights)")


def _run_on_full_disk(mountpoint: Path, size: str, entry: str, argv: list[str]):
    """`instella_recipes.scripts.<entry>.main(argv)` in a private mount namespace where `mountpoint` is a tmpfs of
    `size`: writes there hit a real ENOSPC; nothing outside the namespace sees the mount. Returns the process and
    the files left on that disk (listed inside the namespace, before the mount goes away with it)."""
    mountpoint.mkdir()
    code = f"import sys; from instella_recipes.scripts.{entry} import main; sys.exit(main({argv!r}) and 0)"
    script = (f'mount -t tmpfs -o size={size} tmpfs "{mountpoint}" || exit 99; "$0" -c "$1"; code=$?; '
              f'cd "{mountpoint}" && find . -type f; exit $code')  # fmt: skip
    proc = subprocess.run([*UNSHARE, "sh", "-c", script, sys.executable, code], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    return proc, [line[2:] for line in proc.stdout.splitlines() if line.startswith("./")]


def _one_error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 1 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


@needs_tmpfs
@pytest.mark.parametrize(
    "case, size",
    [("pretrain-checkpoint-save", "300k"), ("pretrain-first-write", "20k"), ("prepare-data", "40k"),
     ("sft-checkpoint-save", "900k")],
)  # fmt: skip
def test_disk_full_is_one_line_naming_the_folder_and_nothing_looks_complete(
    post_world, data_dir, tmp_path, case, size
):
    disk = tmp_path / "disk"
    out = disk / "run"
    if case.startswith("pretrain"):
        entry, argv = "pretrain", pretrain_argv(data_dir, out, max_steps=4, save_steps=2)
    elif case == "prepare-data":
        entry, argv = (
            "prepare_data",
            [
                "--output_dir",
                str(out),
                "--sources",
                str(post_world / "text.jsonl"),
                "--train_tokenizer_vocab_size",
                "300",
                "--seq_len",
                "16",
                "--num_proc",
                "1",
            ],
        )
    else:
        entry, argv = "sft", sft_argv(post_world, out, "--save_strategy", "steps", "--save_steps", "1")
    proc, left = _run_on_full_disk(disk, size, entry, argv)  # fmt: skip
    line = _one_error_line(proc)
    # the run folder, or the file inside it that the failed write was for
    assert line.startswith((f"error: {out}: ", f"error: {out}/")) and "No space left on device" in line, line
    if entry == "prepare_data":  # built aside: the half-written .partial folder is removed
        assert not left, left
    assert not [name for name in left if name.endswith("manifest.json")], left
    # a checkpoint counts as complete once its trainer_state.json is written (the last file the Trainer writes)
    assert not [name for name in left if name.startswith("run/checkpoint-") and name.endswith("trainer_state.json")]


def _without_root() -> list[str]:
    """A command prefix under which a mode-000 file cannot be read: root reads it anyway, but not from a new user
    namespace with no uid mapping (no capabilities over the files of the host's namespace), where it still owns
    (and runs) everything else. Nothing for a user who is not root."""
    return ["unshare", "-U"] if os.geteuid() == 0 else []


@pytest.mark.parametrize("entry", ["prepare_data", "sft"])
def test_permission_denied_on_the_data_names_the_file(post_world, tmp_path, entry):
    """A mode-000 data file: one line naming it with "Permission denied" (not "No such file"), exit 1."""
    if os.geteuid() == 0 and subprocess.run(["unshare", "-U", "true"], capture_output=True).returncode != 0:
        pytest.skip("root here, and no user namespace to give up its rights in (unshare -U)")
    denied = tmp_path / ("chat.jsonl" if entry == "sft" else "text.jsonl")
    shutil.copy(post_world / denied.name, denied)
    denied.chmod(0)
    if entry == "sft":
        argv = sft_argv(post_world, tmp_path / "out", source=denied)
    else:
        argv = ["--output_dir", str(tmp_path / "out"), "--sources", str(denied), "--train_tokenizer_vocab_size",
                "300", "--seq_len", "16"]  # fmt: skip
    code = f"import sys; from instella_recipes.scripts.{entry} import main; sys.exit(main({argv!r}) and 0)"
    proc = subprocess.run([*_without_root(), sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    line = _one_error_line(proc)
    assert f"error: {denied}: Permission denied" in line, line
    assert not (tmp_path / "out" / "manifest.json").exists()
