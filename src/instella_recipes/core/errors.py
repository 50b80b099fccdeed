"""The one error type for bad user input, and the wrapper that turns it into a clear exit.

Every check of a recipe, a data file, a checkpoint or a command-line value raises `RecipeError` with one line that
names the file (and line) or the field, and says what to do. Entry points wrap `main` in `exit_on_recipe_error`:
the user sees `error: <message>` on stderr and exit code 2, before any work has started and with no traceback.
"""

import difflib
import functools
import sys
from collections.abc import Callable, Iterable


class RecipeError(ValueError):
    """Bad user input (recipe, data, checkpoint). Entry points print it without a traceback and exit with 2."""


def exit_on_recipe_error(main: Callable) -> Callable:
    """Wrap an entry point's `main` so a `RecipeError` becomes `error: <message>` on stderr and exit code 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except RecipeError as err:
            print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None

    return wrapper


def did_you_mean(name: str, known: Iterable[str], otherwise: str = "remove it or check the spelling") -> str:
    """`did you mean 'x'?` for the known name closest to `name`, else `otherwise` (for error messages)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean '{close[0]}'?" if close else otherwise
