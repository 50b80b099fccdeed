"""The first mistakes on a command line, answered before the slow imports (torch, TRL) with the fix.

Entry points that run a recipe call `preflight(<script>, <example recipe>)` at the very top of their file: with no
arguments, a recipe given without `--config`, or a `--config` file that does not exist, the user sees one line
naming the fix (and the nearest existing recipe) in about a second instead of an unrelated error after ten. The same
hints serve the full parser (`core.recipe`) when a mistake is only visible there: an argument no flag takes, a
bf16 recipe on a machine without a GPU.

Nothing slow is imported here (no torch, no TRL), so an entry point can call it before its own imports.
"""

import difflib
import sys
from pathlib import Path

from .checks import check_numbers
from .errors import RecipeError
from .paths import RECIPES_DIR
from .recipe_yaml import recipe_mapping

RECIPE_SUFFIXES = (".yaml", ".yml")
# The toy-scale recipe of the same stage (by the recipe's file name), for a GPU recipe started on a CPU machine.
TINY_TWIN = {
    ("sft",): "recipes/tiny/sft.yaml",
    ("dpo",): "recipes/tiny/dpo.yaml",
    ("grpo",): "recipes/tiny/grpo.yaml",
    ("pretrain", "code_finetune", "zaya", "olmoe"): "recipes/tiny/pretrain_stage1.yaml",
}
ONE_GPU = "docs/finetune_one_gpu.md"


def known_recipes() -> list[str]:
    """Every recipe in the clone, as `recipes/<model>/<stage>.yaml` (empty when the package runs without one)."""
    if not RECIPES_DIR.is_dir():
        return []
    return sorted(p.relative_to(RECIPES_DIR.parent).as_posix() for p in RECIPES_DIR.rglob("*.yaml"))


def missing_recipe_message(path: str | Path) -> str:
    """`recipe file X does not exist` plus the nearest existing recipe (by name) or where recipes live; for a right
    path typed outside the repository root, that paths are relative to it."""
    path = Path(path)
    if not path.is_absolute() and (RECIPES_DIR.parent / path).is_file():  # typed right, from another folder
        return (
            f"recipe file {path} does not exist here ({Path.cwd()}): recipe paths, like the runs/ folders recipes "
            f"name, are relative to the repository root: cd {RECIPES_DIR.parent} first"
        )
    recipes = known_recipes()
    tail = Path(*path.parts[path.parts.index("recipes") :]).as_posix() if "recipes" in path.parts else path.as_posix()
    close = difflib.get_close_matches(tail, recipes, n=1, cutoff=0.5)
    if not close:  # a wrong folder with a right name: recipes/instella/sft.yaml -> recipes/instella-3b/sft.yaml
        same_name = [r for r in recipes if Path(r).name == path.name]
        close = difflib.get_close_matches(tail, same_name, n=1, cutoff=0) if same_name else []
    hint = f"did you mean --config {close[0]}?" if close else "recipes are recipes/<model>/<stage>.yaml (see README)"
    return f"recipe file {path} does not exist: {hint}"


def unused_arguments_message(extra: list[str]) -> str:
    """What to say for arguments that no flag takes (a recipe path given without `--config`, mostly)."""
    recipe = next((a for a in extra if a.endswith(RECIPE_SUFFIXES)), None)
    if recipe:
        return f"unexpected argument '{recipe}': did you mean --config {recipe}?"
    return f"unexpected argument(s) {' '.join(extra)}: every value follows its --flag (see --help)"


def check_command_line(args: list[str], example: str, config_required: bool = True) -> None:
    """Raise a `RecipeError` naming the fix for: no arguments at all (when a recipe is required), a first argument
    that is not a flag, a `--config` without a path or with a path that does not exist. `example` is the recipe the
    message suggests (e.g. `recipes/tiny/sft.yaml`)."""
    if any(a in ("-h", "--help") for a in args):
        return
    if not args and config_required:
        raise RecipeError(
            f"no recipe given: pass --config recipes/<model>/<stage>.yaml (see README), e.g. --config {example}"
        )
    if args and not args[0].startswith("-"):
        raise RecipeError(unused_arguments_message([args[0]]))
    stray = [a for prev, a in zip(args, args[1:]) if a.endswith(RECIPE_SUFFIXES) and not prev.startswith("-")]
    if stray and "--config" not in args:  # `--max_steps 2 recipes/tiny/sft.yaml`: the recipe without its flag
        raise RecipeError(unused_arguments_message(stray))
    if "--config" in args:
        index = args.index("--config")
        if index + 1 >= len(args) or args[index + 1].startswith("--"):
            raise RecipeError(f"--config needs a path to a recipe YAML file, e.g. --config {example}")
        if not Path(args[index + 1]).is_file():
            raise RecipeError(missing_recipe_message(args[index + 1]))
        check_recipe_file(Path(args[index + 1]))


def check_recipe_file(path: Path) -> None:
    """What is wrong with the recipe file by itself, seconds before torch and TRL load: not valid YAML, a duplicate
    key (`file:line`), not a mapping, a NaN or infinite number. (An unknown key needs the stage's dataclasses, so
    the full parser names it, after those imports.)"""
    data, _ = recipe_mapping(path)  # the caller found the file (`check_command_line`)
    for key, value in data.items():
        try:
            check_numbers(value, key)
        except ValueError as err:
            raise RecipeError(f"{path}: {err}") from None


def preflight(script: str, example: str, config_required: bool = True) -> None:
    """`check_command_line(sys.argv[1:])` when this process was started as `script` (`scripts/<script>.py` or the
    `instella-<script>` console script); on a mistake print `error: ...` and exit 2. An import of the module by
    another program (a test, the pipeline) does nothing here: its `main(argv)` parses its own arguments."""
    started_as = Path(sys.argv[0]).name if sys.argv else ""
    if started_as not in (f"{script}.py", f"instella-{script.replace('_', '-')}"):
        return
    try:
        check_command_line(sys.argv[1:], example, config_required)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def _hardware(first_line: str) -> str:
    """The hardware a recipe's first comment line names: the text before its first comma outside parentheses
    (`# 1 GPU with >= 16 GB (sizing: 10.5 GB at 4 x 2048 tokens, ...), global batch 32` -> `1 GPU ... ...)`)."""
    depth = 0
    text = first_line.lstrip("# ")
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth <= 0:
            return text[:i].strip()
    return text.strip()


def hardware_hint(path: Path | None) -> str:
    """For a recipe that asks for bf16 on GPUs, started on a machine without one: the hardware its first comment
    line names and what to run here instead: for a CPU recipe given `--bf16 true`, to leave bf16 off; for the one-GPU
    fine-tuning recipes, that page's "Try it on CPU first" command; else the toy-scale recipe of the same stage."""
    lines = Path(path).read_text().splitlines() if path is not None and Path(path).is_file() else []
    hardware = _hardware(lines[0]) if lines and lines[0].startswith("#") else ""
    where = f"written for {hardware}" if hardware else "bf16 asks for a GPU"
    stem = Path(path).stem if path is not None else ""
    if hardware.lower().startswith("cpu") or (path is not None and Path(path).parent.name == "tiny"):
        return (
            f"{where}, and bf16 asks for a GPU with bf16, which this machine does not have: leave bf16 as the "
            f"recipe sets it (--bf16 false)"
        )
    if stem.startswith("finetune"):
        return (
            f"{where}, and this machine has no GPU with bf16: try the recipe on CPU first with the command under "
            f'"Try it on CPU first" in {ONE_GPU} (the demo\'s model, --bf16 false --dtype float32, toy sizes)'
        )
    twin = next((t for prefixes, t in TINY_TWIN.items() if stem.startswith(prefixes)), None)
    instead = f"--config {twin} runs the same stage at toy size on CPU" if twin else "recipes/tiny/ has CPU recipes"
    return f"{where}, and this machine has no GPU with bf16: {instead}; fine-tuning on one GPU: {ONE_GPU}"
