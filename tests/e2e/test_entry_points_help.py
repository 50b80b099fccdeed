"""The end-to-end half of tests/unit/repo/test_layout.py
(processes, whole runs, oracles); the in-process tests are there.

The re-cut layout: what `pip install -e .` adds to a user's environment, what `recipes/` holds, and that every
entry point parses through the one recipe parser (`--help` lists `--config`; unknown flags are named)."""

import json
import subprocess
import sys

import pytest

from tests.unit.repo import test_layout as unit_half  # fixtures and helpers both halves use

ROOT, SCRIPTS = unit_half.ROOT, unit_half.SCRIPTS


@pytest.fixture(scope="module")
def helps(tmp_path_factory) -> dict:
    """`python scripts/<name>.py --help` of every script, each in a process of its own, forked from one that imported
    the third-party packages once (tests/helpers/forked_scripts.py): a fresh interpreter per script paid those
    imports 23 times (about 3 CPU s each)."""
    out = tmp_path_factory.mktemp("helps") / "helps.json"
    scripts = [str(ROOT / "scripts" / f"{name}.py") for name in SCRIPTS]
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "helpers" / "forked_scripts.py"), str(out),
                           json.dumps(["--help"]), *scripts], capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    return {name: results[script] for name, script in zip(SCRIPTS, scripts, strict=True)}


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_entry_point_shows_config_in_help_and_names_unknown_flags(name, helps):
    module = __import__(f"instella_recipes.scripts.{name}", fromlist=["main"])
    out = helps[name]
    assert out["returncode"] == 0, out["stderr"][-2000:]
    assert "--config" in out["stdout"]
    argv = ["to-hub"] if name == "convert_checkpoint" else []
    with pytest.raises(SystemExit) as exit_info:
        module.main([*argv, "--no_such_flag_at_all", "1"])
    assert exit_info.value.code == 2
