"""The end-to-end half of tests/unit/repo/test_documented_commands.py (how commands are read from the docs, and which
are left out and why: its docstring): every other documented command runs for real, as written, after a
demo-shaped setup, in document order, in a scratch folder, with `--max_steps 2` on training.
"""

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.unit.repo import test_documented_commands as unit_half  # fixtures and helpers both halves use

(
    COMMANDS,
    DOCS,
    EXTERNAL,
    FENCE,
    INLINE,
    LOOP,
    ROOT,
    RUN,
    RUN_FIRST,
    _block_commands,
    _expect_exit_zero,
    _is_tiny,
    _main,
    _script_part,
    _split,
    _strip_comment,
    classify,
    documented_commands,
) = (
    unit_half.COMMANDS,
    unit_half.DOCS,
    unit_half.EXTERNAL,
    unit_half.FENCE,
    unit_half.INLINE,
    unit_half.LOOP,
    unit_half.ROOT,
    unit_half.RUN,
    unit_half.RUN_FIRST,
    unit_half._block_commands,
    unit_half._expect_exit_zero,
    unit_half._is_tiny,
    unit_half._main,
    unit_half._script_part,
    unit_half._split,
    unit_half._strip_comment,
    unit_half.classify,
    unit_half.documented_commands,
)


TRAINING = {"pretrain", "sft", "dpo", "grpo"}
IN_A_PROCESS = {"evaluate"}  # evaluate.py hands over to lm_eval with os.execve: it would replace pytest


def _quick(script: str, args: list[str]) -> list[str]:
    """The documented arguments, with training cut to 2 steps (a documented `--max_steps` replaced: a flag given
    twice is an error). GRPO's 2 steps on the by-hand chain's barely trained model may find every reward equal,
    which ends a run non-zero (no learning signal, `grpo_signal.py`): here `allow_no_signal` lets it finish, since
    this test checks that the command runs as written (test_grpo_runs.py checks that GRPO learns)."""
    if Path(script).stem not in TRAINING:
        return list(args)
    args = list(args)
    if "--max_steps" in args:
        args[args.index("--max_steps") + 1] = "2"
    else:
        args += ["--max_steps", "2"]
    if Path(script).stem == "grpo" and "--allow_no_signal" not in args:
        args += ["--allow_no_signal", "true"]
    return args


def _run_in_a_process(argv: list[str], where: str) -> None:
    """`lm_eval ...` and `python scripts/evaluate.py ...` as a shell would run them, from the scratch folder."""
    bin_dir = str(Path(sys.executable).parent)
    command = [sys.executable, *argv[1:]] if argv[0] == "python" else argv
    env = {**os.environ, "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{where}: {shlex.join(argv)}: exit {done.returncode}\n{done.stderr[-3000:]}"


@pytest.mark.usefixtures("one_thread")
def test_documented_commands_run_in_order(tmp_path, monkeypatch):
    """Every documented command that needs no GPU, cluster, Hub or placeholder (`unit_half.why_not_run`), as written
    (plus `--max_steps 2` for training), each finding its inputs where an earlier documented command wrote them.
    Issue 32: the by-hand chain (docs/pretraining.md, docs/post_training.md) works after `make demo`: the demo's
    finished stages are there first (complete outputs, manifests), and the chain runs without `--overwrite` and
    leaves them as they were. Issue 42: so does every later page (GRPO, evaluation, the HELMET smoke run, ...), whose
    commands read the demo's folders: here the by-hand ones stand in for them."""
    from instella_recipes.core import write_manifest

    for name in ("recipes", "eval", "scripts"):  # a clone's folders the commands name
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    demo = Path("runs/demo")
    for stage in ("prepare", "stage1", "stage2_5796", "merge", "draft", "sft", "dpo", "sft-lora", "grpo"):
        (demo / stage).mkdir(parents=True)
        (demo / stage / "weights.bin").write_bytes(b"the demo's")
        write_manifest(demo / stage, stage)
    before = {str(p): p.stat().st_mtime_ns for p in demo.rglob("*")}
    run = unit_half.commands_to_run()
    chain = [(w, a) for w, a in run if w in RUN_FIRST]
    for where, argv in run:
        if (where, argv) not in chain and demo.is_dir() and not demo.is_symlink():
            assert {str(p): p.stat().st_mtime_ns for p in demo.rglob("*")} == before, "the demo's stages changed"
            shutil.rmtree(demo)
            demo.symlink_to("tiny")  # the later pages read the demo's folders: the by-hand chain made the same stages
        print(f"{where}: {shlex.join(argv)}", file=sys.stderr)
        if argv[0] == "lm_eval" or Path(_script_part(argv)[0]).stem in IN_A_PROCESS:
            _run_in_a_process(argv, where)
            continue
        script, *args = _script_part(argv)
        _expect_exit_zero(_main(script), _quick(script, args))
    made = {p.name for p in Path("runs/tiny").iterdir()}
    assert {"prepare", "stage1", "merge", "draft", "sft", "dpo", "sft-lora", "grpo", "eval_merge", "helmet"} <= made
    assert all(
        (Path("runs/tiny") / n / "manifest.json").is_file() for n in ("merge", "sft", "dpo", "sft-lora", "grpo")
    )
    assert os.path.isfile("runs/tiny/sft-lora/adapter/adapter_config.json")
    assert list(Path("runs/tiny/eval_merge").rglob("results*.json")) and list(
        Path("runs/tiny/helmet").rglob("samples*")
    )
