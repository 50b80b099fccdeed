"""Recipe YAML -> dataclass arguments, the TRL way (`TrlParser`), with unknown keys reported by file and line.

One YAML is one run. `--config recipe.yaml` sets the defaults; any `--flag value` on the command line overrides
them. TRL's parser already refuses unknown keys, but only as a list; we check first so the error names the file,
the line and the closest known key, before any model or data work starts.
"""

import difflib
import sys
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

import yaml

from .errors import RecipeError


def _config_path(args: list[str]) -> Path | None:
    if "--config" not in args:
        return None
    index = args.index("--config")
    if index + 1 >= len(args):
        raise RecipeError("--config needs a path to a recipe YAML file")
    return Path(args[index + 1])


def load_recipe_yaml(path: Path) -> tuple[dict, dict[str, int]]:
    """Read a recipe file; return its mapping and the line number of every top-level key."""
    if not path.is_file():
        raise RecipeError(f"recipe file {path} does not exist (pass --config recipes/<model>/<stage>.yaml)")
    text = path.read_text()
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a recipe must be a YAML mapping of argument names to values")
    lines = {key.value: key.start_mark.line + 1 for key, _ in node.value} if node is not None else {}
    return data, lines


def check_recipe_keys(path: Path, data: dict, lines: dict[str, int], known: Iterable[str]) -> None:
    """Raise a `RecipeError` naming `file:line` for the first key no dataclass declares."""
    known = set(known) | {"env"}
    for key in data:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean '{close[0]}'?" if close else "remove it or check the spelling"
            raise RecipeError(f"{path}:{lines.get(key, '?')}: unknown key '{key}' ({hint})")


def parse_recipe(dataclass_types: Iterable[type], args: list[str] | None = None) -> tuple:
    """Parse `--config <yaml>` plus command-line overrides into one instance of each dataclass type."""
    dataclass_types = list(dataclass_types)
    args = list(sys.argv[1:] if args is None else args)
    path = _config_path(args)
    if path is not None:
        data, lines = load_recipe_yaml(path)
        check_recipe_keys(path, data, lines, (f.name for dc in dataclass_types for f in fields(dc)))
    from trl import TrlParser  # imported here: TRL is slow to import and tools that only raise errors skip it

    try:
        return tuple(TrlParser(dataclass_types).parse_args_and_config(args))
    except ValueError as err:  # the dataclasses' own __post_init__ checks
        raise RecipeError(f"{path or 'command line'}: {err}") from None
