"""The end-to-end half of tests/unit/core/test_first_errors.py
(processes, whole runs, oracles); the in-process tests are there.

A new user's first mistakes on the command line get one line that names the fix, and the cheap ones get it before
torch or TRL is imported (core.command_line.preflight at the top of each recipe entry point)."""

import subprocess
import sys
import textwrap

import pytest

from tests.unit.core import test_first_errors as unit_half  # fixtures and helpers both halves use

ROOT = unit_half.ROOT


# Runs an entry point as `python scripts/<x>.py ...` would and says, at exit, which slow packages were imported.
CHILD = textwrap.dedent(
    """
    import atexit, runpy, sys
    SLOW = ("torch", "trl", "datasets", "peft", "accelerate")
    atexit.register(lambda: print("slow imports:", sorted({m.split(".")[0] for m in sys.modules} & set(SLOW)),
                                  file=sys.stderr))
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
    """
)


def _run(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["scripts/sft.py"], "pass --config recipes/<model>/<stage>.yaml (see README), e.g. --config recipes/tiny/s"),
        (["scripts/pretrain.py"], "e.g. --config recipes/tiny/pretrain_stage1.yaml"),
        (["scripts/dpo.py", "recipes/tiny/dpo.yaml"], "did you mean --config recipes/tiny/dpo.yaml?"),
        (["scripts/sft.py", "--max_steps", "2", "recipes/tiny/sft.yaml"], "did you mean --config recipes/tiny/sft"),
        (["scripts/pipeline.py", "recipes/tiny/pipeline.yaml"], "did you mean --config recipes/tiny/pipeline.yaml?"),
        (["scripts/sft.py", "--config", "recipes/tiny/sfft.yaml"], "did you mean --config recipes/tiny/sft.yaml?"),
        (["scripts/sft.py", "--config", "recipes/instella/sft.yaml"], "did you mean --config recipes/instella-3b/sft"),
        (["scripts/prepare_data.py", "--config"], "--config needs a path to a recipe YAML file"),
    ],
)  # fmt: skip
def test_first_mistakes_name_the_fix_before_the_heavy_imports(argv, expected):
    result = _run(*argv)
    assert result.returncode == 2, result.stderr[-2000:]
    assert expected in result.stderr and "Traceback" not in result.stderr, result.stderr[-2000:]
    assert "slow imports: []" in result.stderr


def test_help_goes_on_to_the_full_parser():
    """The check never stands in the way: `--help` reaches the real parser (which imports TRL to list every flag)."""
    result = _run("scripts/sft.py", "--help")
    assert result.returncode == 0 and "--learning_rate" in result.stdout and "'trl'" in result.stderr


@pytest.mark.parametrize(
    "text, expected",
    [
        ("learning_rate: 0.001\nwarmup_steps: 3\nlearning_rate: 1.0\n", "recipe.yaml:3: duplicate key 'learning_rate' (first at line 1)"),  # noqa: E501
        ("learning_rate: [0.001\n", "recipe.yaml: not valid YAML"),
        ("- learning_rate\n", "recipe.yaml: a recipe must be a YAML mapping"),
        ("learning_rate: .nan\n", "recipe.yaml: learning_rate must be a finite number, got nan"),
    ],
)  # fmt: skip
def test_a_broken_recipe_file_is_named_before_the_heavy_imports(tmp_path, text, expected):
    """Issue 32: what is wrong with the recipe file by itself is said before torch and TRL load (24-170 s on a loaded
    machine), not after."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    result = _run("scripts/sft.py", "--config", str(recipe))
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "slow imports: []" in result.stderr
