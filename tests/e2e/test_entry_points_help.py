"""The end-to-end half of tests/unit/repo/test_layout.py
(processes, whole runs, oracles); the in-process tests are there.

The re-cut layout: what `pip install -e .` adds to a user's environment, what `recipes/` holds, and that every
entry point parses through the one recipe parser (`--help` lists `--config`; unknown flags are named)."""

import subprocess
import sys

import pytest

from tests.unit.repo import test_layout as unit_half  # fixtures and helpers both halves use

ROOT, SCRIPTS = unit_half.ROOT, unit_half.SCRIPTS


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_entry_point_shows_config_in_help_and_names_unknown_flags(name):
    module = __import__(f"instella_recipes.scripts.{name}", fromlist=["main"])
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / f"{name}.py"), "--help"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--config" in out.stdout
    argv = ["to-hub"] if name == "convert_checkpoint" else []
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--no_such_flag_at_all", "1"])
    assert exit_info.value.code == 2
