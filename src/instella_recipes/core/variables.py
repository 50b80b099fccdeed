"""Named values in text: `{name}` placeholders, and the `VAR=VALUE` assignments that set them from a command line.

One placeholder syntax for the whole project: the pipeline fills its stage arguments, outputs, env and recipe
overrides with it (`instella_recipes.pipeline.graph`), and pretraining fills `output_dir: runs/stage2_{seed}` with it
(`instella_recipes.pretraining.pretrain`). A placeholder is `{` + a Python identifier + `}`; any other brace (a JSON
value, `{}`) is left as it is. A placeholder with no value is a `RecipeError` naming where it is and the names there
are, never a silent blank.

One `--set` parser: `scripts/pipeline.py` and the Slurm job it submits both read `--set VAR=VALUE` with
`parse_assignments`, so an item without `=` is refused with the same message everywhere.
"""

import re
from collections.abc import Iterable, Mapping

from .errors import RecipeError, did_you_mean

PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")


def unknown_placeholder(name: str, known: Iterable[str], where: str, otherwise: str = "") -> RecipeError:
    """The error for `{name}` with no value at `where` (e.g. `file:line: stage 'x' args`)."""
    known = sorted(known)
    fallback = otherwise or ("placeholders here: " + ", ".join(f"{{{k}}}" for k in known) if known else "none here")
    return RecipeError(f"{where}: unknown placeholder {{{name}}} ({did_you_mean(name, known, fallback)})")


def fill_placeholders(text: str, values: Mapping[str, object], where: str, otherwise: str = "") -> str:
    """`text` with every `{name}` replaced by `str(values[name])`; an unknown name is a `RecipeError` naming `where`
    and the closest known name (`otherwise`: the hint when none is close)."""

    def fill(match: re.Match) -> str:
        name = match.group(1)
        if name not in values:
            raise unknown_placeholder(name, values, where, otherwise)
        return str(values[name])

    return PLACEHOLDER.sub(fill, text)


def split_assignment(item: str, flag: str, form: str = "VAR=VALUE") -> tuple[str, str]:
    """`"key=value"` -> `("key", "value")` (the value may hold `=` itself); no `=` or no key is a `RecipeError`
    naming the flag and the expected form."""
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise RecipeError(f"{flag} expects {form}, got '{item}'")
    return key, value


def parse_assignments(items: Iterable[str], flag: str = "--set") -> dict[str, str]:
    """The `--set VAR=VALUE` items of a command line as a mapping (the last one wins for a name given twice). The
    values stay text: the pipeline reads each as YAML against its `vars`."""
    return dict(split_assignment(item, flag) for item in items)
