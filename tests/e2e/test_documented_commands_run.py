"""The end-to-end half of tests/unit/repo/test_documented_commands.py
(processes, whole runs, oracles); the in-process tests are there.

Every command in README.md and docs/*.md works as written.

The commands are read from the Markdown itself (bash code blocks, with `\\` continuations joined and `for` loops
expanded, plus inline `python scripts/...` spans), so a new or edited line is checked without touching this file:

- the tiny ones (a `recipes/tiny/` or `recipes/zaya1/tiny_*` recipe or the demo's model, the merge of the tiny
  seeds, sizing) run for
  real, in document order (docs/pretraining.md, then docs/post_training.md, then the rest) in a scratch folder, with
  `--max_steps 2` added to training so the chain is quick; each one's inputs must come from an earlier command (they
  use the demo's folders, `runs/demo/<stage>`, as `make demo` leaves them);
- the tiny pipeline commands run with `--dry_run` (the demo itself is test_pipeline_e2e.py);
- those that need a cluster, a GPU, the Hub or a placeholder (`<dir>`) parse as written: the script's own parser
  sees the documented flags and recipe (unknown flags and recipe keys are errors) and then `--help`;
- `lm_eval`: the include path exists and defines every task named; `sbatch`: the launcher and the recipe exist;
  `accelerate launch` / `torchrun`: the config file exists, the script's part parses as above; `make`: the target.
"""

import os
import shlex
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
    documented command wrote them."""
    for name in ("recipes", "eval"):
        (tmp_path / name).symlink_to(ROOT / name)
    monkeypatch.chdir(tmp_path)
    for where, argv in RUN:
        script, *args = _script_part(argv)
        extra = ["--max_steps", "2"] if Path(script).stem in TRAINING else []
        print(f"{where}: {shlex.join(argv)}", file=sys.stderr)
        _expect_exit_zero(_main(script), args + extra)
    made = {p.name for p in Path("runs/demo").iterdir()}
    assert {"prepare", "stage1", "merge", "draft", "sft", "dpo", "sft-lora"} <= made
    assert all((Path("runs/demo") / n / "manifest.json").is_file() for n in ("merge", "sft", "dpo", "sft-lora"))
    assert os.path.isfile("runs/demo/sft-lora/adapter/adapter_config.json")
