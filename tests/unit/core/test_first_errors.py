"""A new user's first mistakes on the command line get one line that names the fix, and the cheap ones get it before
torch or TRL is imported (core.command_line.preflight at the top of each recipe entry point)."""

import importlib
from pathlib import Path

import pytest
import torch

from instella_recipes.core.command_line import hardware_hint, missing_recipe_message

ROOT = Path(__file__).resolve().parents[3]
# The library module whose `main(argv)` each training entry point (scripts/<x>.py) calls.
STAGE_MODULES = {
    "sft": "instella_recipes.post_training.sft",
    "dpo": "instella_recipes.post_training.dpo",
    "pretrain": "instella_recipes.pretraining.pretrain",
}


def test_missing_recipe_without_a_near_name_says_where_recipes_are():
    message = missing_recipe_message("my_recipe.yaml")
    assert "recipes/<model>/<stage>.yaml" in message or "did you mean" in message


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without a GPU")
@pytest.mark.parametrize(
    "script, recipe, twin",
    [
        ("sft", "recipes/instella-3b/sft.yaml", "recipes/tiny/sft.yaml"),
        ("dpo", "recipes/instella-3b/dpo.yaml", "recipes/tiny/dpo.yaml"),
        ("pretrain", "recipes/instella-3b/pretrain_stage1.yaml", "recipes/tiny/pretrain_stage1.yaml"),
    ],
)
def test_gpu_recipe_on_a_cpu_machine_names_its_hardware_and_the_tiny_recipe(script, recipe, twin, capsys):
    """transformers would say "Your setup doesn't support bf16/gpu. You need to assign use_cpu", whose fix
    (--use_cpu true) only moves the failure to loading a 3B model on CPU."""
    main = importlib.import_module(STAGE_MODULES[script]).main
    with pytest.raises(SystemExit) as done:
        main(["--config", str(ROOT / recipe)])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "MI300X" in err and f"--config {twin}" in err and "docs/finetune_one_gpu.md" in err, err
    assert "use_cpu" not in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="the message is for a machine without a GPU")
@pytest.mark.parametrize(
    "argv, expected",
    [
        # issue 32: it told the user to run the recipe they had just run
        (["--config", "recipes/tiny/sft.yaml", "--bf16", "yes"], "written for CPU (2 cores), and bf16 asks for a GPU "
         "with bf16, which this machine does not have: leave bf16 as the recipe sets it (--bf16 false)"),
        # issue 32: the hardware was cut at a comma inside its parentheses, and the hint named another recipe
        (["--config", "recipes/instella-3b/finetune-lora-1gpu.yaml"], "written for 1 GPU with >= 16 GB (scripts/"
         "sizing.py: 10.5 GB at 4 x 2048 tokens, bf16 base + LoRA r 16, activation checkpointing), and this machine "
         'has no GPU with bf16: try the recipe on CPU first with the command under "Try it on CPU first" in '
         "docs/finetune_one_gpu.md"),
    ],
)  # fmt: skip
def test_bf16_on_a_cpu_machine_says_what_works_here(argv, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:
        importlib.import_module(STAGE_MODULES["sft"]).main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert done.value.code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert expected in lines[0]
    assert lines[0].count("(") == lines[0].count(")")


def test_hardware_hint_without_a_recipe_file():
    assert "recipes/tiny/" in hardware_hint(None)


def _docstring_commands():
    """`python scripts/<x>.py ...` lines of each entry point's docstring (the usage a user copies from `--help`)."""
    import ast

    from tests.unit.repo.test_documented_commands import _block_commands, _split

    found = []
    for path in sorted((ROOT / "scripts").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        for line in _block_commands(doc):
            argv = _split(line.strip())
            if argv[:2] == ["python", f"scripts/{path.name}"]:
                found.append((path.stem, argv[2:]))
    return found


@pytest.mark.parametrize("script, args", _docstring_commands(), ids=lambda v: v if isinstance(v, str) else None)
def test_every_usage_line_in_a_scripts_docstring_parses(script, args, capsys, monkeypatch):
    """Flags shown in a docstring exist (convert_checkpoint's once showed `--config config.json`, a recipe flag)."""
    monkeypatch.chdir(ROOT)
    main = importlib.import_module(f"instella_recipes.scripts.{script}").main
    args = [a for a in args if a != "..."]
    with pytest.raises(SystemExit) as done:
        main(["--help", *args])  # --help first: argparse stops there, metavariables (`--limit N`) pass
    assert done.value.code in (0, None)
    assert "unknown" not in capsys.readouterr().err
