"""Recipe YAML -> dataclass arguments, the TRL way (`TrlParser`), with unknown keys reported by file and line.

One YAML is one run. `--config recipe.yaml` sets the defaults; any `--flag value` on the command line overrides
them. TRL's parser already refuses unknown keys, but only as a list; we check first so the error names the file,
the line and the closest known key, before any model or data work starts. A key given twice in one mapping is an
error naming both lines (YAML loaders keep the last one silently), and so is a flag given twice on the command
line (argparse keeps the last; list flags such as `--stage` add up instead). Every parsed number is then checked to be
finite and within int64 (`check_numbers`), whatever its field: the dataclasses' own checks give the ranges.
"""

import ast
import sys
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from .checks import check_numbers
from .command_line import hardware_hint, missing_recipe_message, unused_arguments_message
from .errors import RecipeError, did_you_mean
from .recipe_yaml import recipe_mapping


def config_path(args: list[str]) -> Path | None:
    """The path after `--config`, or None."""
    if "--config" not in args:
        return None
    index = args.index("--config")
    if index + 1 >= len(args):
        raise RecipeError("--config needs a path to a recipe YAML file")
    return Path(args[index + 1])


def load_recipe_yaml(path: Path) -> tuple[dict, dict[str, int]]:
    """Read a recipe file; return its mapping and the line number of every top-level key."""
    if not path.is_file():
        raise RecipeError(missing_recipe_message(path))
    return recipe_mapping(path)


def check_recipe_keys(
    path: Path, data: dict, lines: dict[str, int], known: Iterable[str], retired: dict[str, str] | None = None
) -> None:
    """Raise a `RecipeError` naming `file:line` for the first key no dataclass declares; for a `retired` one (a key a
    stage used to take), what to write instead."""
    known, retired = set(known) | {"env"}, retired or {}
    for key in data:
        if key not in known:
            hint = retired.get(key) or did_you_mean(key, known)
            raise RecipeError(f"{path}:{lines.get(key, '?')}: unknown key '{key}' ({hint})")


def retired_keys(dataclass_types: Iterable[type]) -> dict[str, str]:
    """The keys the dataclasses no longer take (the `retired_keys` attribute of each class in their MRO: a settings
    class and its mixins each name their own) -> what to write instead."""
    return {
        key: hint
        for dc in dataclass_types
        for klass in dc.__mro__
        for key, hint in vars(klass).get("retired_keys", {}).items()
    }


def _option_names(parser) -> set[str]:
    # private: argparse lists its actions nowhere public [test_private_apis]
    return {option for action in parser._actions for option in action.option_strings}


def check_flags(parser, args: list[str], retired: dict[str, str] | None = None) -> None:
    """Every `--flag` on the command line is one the parser knows; otherwise the same hint as an unknown YAML key.

    argparse's own message ("unrecognized arguments") comes after parsing and names no alternative; prefix
    matching is off (`allow_abbrev=False`), so `--learning_rat` is an error here, not `--learning_rate`.
    """
    known, repeatable, seen = _option_names(parser), _list_flags(parser), {}
    for arg in args:
        if arg == "--":
            break
        if arg.startswith("--"):
            flag = arg.split("=", 1)[0]
            if flag not in known:
                hint = (retired or {}).get(flag[2:]) or did_you_mean(flag, known, "see --help for every field")
                raise RecipeError(f"command line: unknown flag '{flag}' ({hint})")
            name = flag.replace("-", "_")  # `--max-steps` is `--max_steps`
            if name in seen and flag not in repeatable:  # argparse keeps the last value silently
                raise RecipeError(
                    f"command line: flag '{flag}' given twice (as '{seen[name]}' before): keep one, as for keys "
                    "given twice in a recipe"
                )
            seen[name] = flag


def _list_flags(parser) -> set[str]:
    """The flags of list fields (`--stage a --stage b` adds up; `_merge_repeated_lists`)."""
    # private: argparse lists its actions nowhere public [test_private_apis]
    return {o for a in parser._actions if a.nargs in ("+", "*") for o in a.option_strings}


def _merge_repeated_lists(parser, args: list[str]) -> list[str]:
    """`--stage a --stage b` means `--stage a b` for list fields (argparse would keep only the last)."""
    list_flags = _list_flags(parser)
    values: dict[str, list[str]] = {}
    out, i = [], 0
    while i < len(args):
        arg = args[i]
        if arg in list_flags:
            j = i + 1
            while j < len(args) and not args[j].startswith("--"):
                j += 1
            if arg not in values:
                values[arg] = []
                out.append(arg)
                out.append(values[arg])
            values[arg].extend(args[i + 1 : j])
            i = j
        else:
            out.append(arg)
            i += 1
    return [x for item in out for x in (item if isinstance(item, list) else [item])]


def _refuse(message: str):
    """argparse's complaint about a command-line value (`--max_steps 1e9`: not an integer) as a `RecipeError`."""
    raise RecipeError(message)  # `parse_recipe` names where it came from


def make_parser(dataclass_types: Iterable[type], config_help: str | None = None):
    """TRL's parser (`TrlParser`: dataclass fields as flags, `--config` YAML as their defaults) with prefix matching
    off and `--config` listed in `--help`. A field's `role` metadata (what the field is to a run, read by
    `trainer/settings.py`) is not an argparse option: the parser drops it (HfArgumentParser passes every metadata key
    to `add_argument`)."""
    from trl import TrlParser  # imported here: TRL is slow to import and tools that only raise errors skip it

    class RecipeParser(TrlParser):
        def add_argument(self, *args, role=None, **kwargs):
            return super().add_argument(*args, **kwargs)

    parser = RecipeParser(list(dataclass_types), allow_abbrev=False)
    parser.error = _refuse  # one line (`error: <where>: ...`, exit 2), not argparse's usage dump
    parser.add_argument(
        "--config",
        metavar="YAML",
        help=config_help or "Recipe file (recipes/<model>/<stage>.yaml): its keys set the defaults; flags override.",
    )
    return parser


def _explain(err: ValueError, path: Path | None) -> str:
    """The parser's or transformers' message, or ours where theirs names no fix (core.command_line)."""
    text = str(err)
    if "not used by the HfArgumentParser" in text:  # a recipe path without --config, or a value without a flag
        extra = text.split(": ", 1)[-1]
        return unused_arguments_message(ast.literal_eval(extra) if extra.startswith("[") else [extra])
    if "doesn't support bf16/gpu" in text:  # TrainingArguments: bf16 asked for, no GPU; `--use_cpu` is not the fix
        return hardware_hint(path)
    return text


def parse_recipe(
    dataclass_types: Iterable[type],
    args: list[str] | None = None,
    config_help: str | None = None,
    config_is_input: bool = False,
):
    """Parse `--config <yaml>` plus command-line overrides into one instance of each dataclass type.

    `config_is_input=True` is for tools whose `--config` is their input document rather than their arguments (the
    pipeline's stage graph): the file is then left to the caller (`config_path(args)`), not applied as defaults.

    Checked before anything is parsed: the YAML's keys (unknown key: `file:line` and the nearest known key) and the
    command line's flags (unknown flag: the nearest known flag). A value a dataclass refuses in `__post_init__`
    becomes a `RecipeError` naming the file or the command line.
    """
    dataclass_types = list(dataclass_types)
    args = list(sys.argv[1:] if args is None else args)
    parser = make_parser(dataclass_types, config_help)
    retired = retired_keys(dataclass_types)
    check_flags(parser, args, retired)
    path = config_path(args)
    if config_is_input and path is not None:
        index = args.index("--config")
        args = args[:index] + args[index + 2 :]
        path = None
    if path is not None:
        data, lines = load_recipe_yaml(path)
        check_recipe_keys(path, data, lines, (f.name for dc in dataclass_types for f in fields(dc)), retired)
    args = _merge_repeated_lists(parser, args)
    try:
        parsed = parser.parse_args_and_config(args)
        # HfArgumentParser returns what no dataclass claims (our `--config`) as a trailing Namespace
        parsed = tuple(item for item in parsed if isinstance(item, tuple(dataclass_types)))
        for item in parsed:
            for f in fields(item):
                check_numbers(getattr(item, f.name, None), f.name)
    except ValueError as err:  # the dataclasses' own __post_init__ checks, and check_numbers
        every_rank = getattr(err, "every_rank", False)  # a mistake of the launch: one line per node (core.errors)
        raise RecipeError(f"{path or 'command line'}: {_explain(err, path)}", every_rank=every_rank) from None
    return parsed
