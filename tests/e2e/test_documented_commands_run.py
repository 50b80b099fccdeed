"""The end-to-end half of tests/unit/repo/test_documented_commands.py (how commands are read from the docs: its
docstring): the tiny commands run for real, in document order, in a scratch folder, with `--max_steps 2` on training.
"""

import os
import shlex
import shutil
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


TRAINING = {"pretrain", "sft", "dpo"}


@pytest.mark.usefixtures("one_thread")
def test_tiny_documented_commands_run_in_order(tmp_path, monkeypatch):
    """The tiny commands as written (plus `--max_steps 2` for training), each finding its inputs where an earlier
    documented command wrote them. Issue 32: the by-hand chain (docs/pretraining.md, docs/post_training.md) works after
    `make demo`: the demo's finished stages are there first (complete outputs, manifests), and the chain runs without
    `--overwrite` and leaves them as they were. The pages after it read the demo's folders; here the by-hand ones
    stand in for them."""
    from instella_recipes.core import write_manifest

    for name in ("recipes", "eval"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    demo = Path("runs/demo")
    for stage in ("prepare", "stage1", "stage2_5796", "merge", "draft", "sft", "dpo", "sft-lora"):
        (demo / stage).mkdir(parents=True)
        (demo / stage / "weights.bin").write_bytes(b"the demo's")
        write_manifest(demo / stage, stage)
    before = {str(p): p.stat().st_mtime_ns for p in demo.rglob("*")}
    chain = [(w, a) for w, a in RUN if w in RUN_FIRST]
    for where, argv in RUN:
        if (where, argv) not in chain and demo.is_dir() and not demo.is_symlink():
            assert {str(p): p.stat().st_mtime_ns for p in demo.rglob("*")} == before, "the demo's stages changed"
            shutil.rmtree(demo)
            demo.symlink_to("tiny")  # the later pages read the demo's folders: the by-hand chain made the same stages
        script, *args = _script_part(argv)
        extra = ["--max_steps", "2"] if Path(script).stem in TRAINING else []
        print(f"{where}: {shlex.join(argv)}", file=sys.stderr)
        _expect_exit_zero(_main(script), args + extra)
    made = {p.name for p in Path("runs/tiny").iterdir()}
    assert {"prepare", "stage1", "merge", "draft", "sft", "dpo", "sft-lora"} <= made
    assert all((Path("runs/tiny") / n / "manifest.json").is_file() for n in ("merge", "sft", "dpo", "sft-lora"))
    assert os.path.isfile("runs/tiny/sft-lora/adapter/adapter_config.json")
