"""Outputs that are either complete or absent: write aside, then rename.

A crash, a kill or a full disk half way leaves a `.partial` sibling (removed on the next attempt), never a file or
folder that a later stage would take for a finished one. `os.replace` is atomic within one filesystem, which the
sibling guarantees.
"""

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from .errors import RecipeError

PARTIAL = ".partial"


def partial_path(path: str | Path) -> Path:
    """The sibling that `path` is written as before it is renamed into place."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write `text` to `path` through a `.partial` sibling and a rename."""
    path = Path(path)
    tmp = partial_path(path)
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **open_kwargs) -> Iterator:
    """Open `path.partial` for writing; on a clean exit rename it to `path`, on an exception remove it."""
    path = Path(path)
    tmp = partial_path(path)
    try:
        with open(tmp, mode, **open_kwargs) as handle:
            yield handle
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def check_output_location(path: str | Path, what: str = "output_dir") -> Path:
    """`path` is a folder that exists or can be made, in a writable place; otherwise a `RecipeError` naming `what`:
    `path` is a file, something on its way is a file, or the nearest existing folder is read-only (a read-only
    mount, or permissions). Call it before any work, so a bad output location is not found after hours."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise RecipeError(f"{what} {path} is a file, not a folder: choose a folder path")
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise RecipeError(f"{what} {path}: {existing} is a file, so no folder can be made under it; fix the path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RecipeError(f"{what} {path}: {existing} is not writable (read-only); choose a writable folder")
    return path


@contextlib.contextmanager
def atomic_output_dir(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield `path.partial` (fresh and empty) to build a folder in; on a clean exit it becomes `path`.

    On an exception the partial folder is removed and `path` is untouched. An existing `path` is replaced only with
    `overwrite=True` (the caller decides, and says so in its own error, whether that is allowed).
    """
    path = check_output_location(path)
    tmp = partial_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if path.exists():
        if not overwrite:
            shutil.rmtree(tmp, ignore_errors=True)
            raise FileExistsError(f"{path} appeared while it was being written")
        shutil.rmtree(path)
    os.replace(tmp, path)


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """`(line number, row)` for each non-blank line of a jsonl file. A line that is not UTF-8, not JSON or not a JSON
    object is a `RecipeError` naming `file:line` and the fix."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise RecipeError(
                    f"{path}:{number}: not UTF-8 text ({err.reason}); re-encode the file as UTF-8"
                ) from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise RecipeError(f"{path}:{number}: malformed JSON ({err.msg}); fix or delete that line") from None
            if not isinstance(row, dict):
                raise RecipeError(f"{path}:{number}: each jsonl line must be a JSON object, got {type(row).__name__}")
            yield number, row
