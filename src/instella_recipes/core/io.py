"""Outputs that are either complete or absent, and the one rule for every stage's output folder.

Writing: a file or folder is written aside (a `.partial` sibling) and renamed into place. A crash, a kill or a full
disk half way leaves the `.partial` sibling (removed on the next attempt), never a file or folder that a later stage
would take for a finished one. `os.replace` is atomic within one filesystem, which the sibling guarantees.

The rule (`check_output_dir` before any work, `claim_output_dir` before the first byte): a folder whose
`manifest.json` says it is a complete output of *any* stage is written into only with `--overwrite`, and then its
manifest is removed first (and durably), so a kill at any later moment leaves no manifest beside other weights. A
stage never writes over one of its own inputs. Paths are checked against the filesystem's NAME_MAX and PATH_MAX
first, so an over-long path is one clear line, not an `OSError` from deep inside a library.
"""

import contextlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

from .errors import RecipeError, naming_write_failures

PARTIAL = ".partial"
ASIDE = ".old"  # a replaced complete folder, renamed aside for the moment of the swap
MANIFEST = "manifest.json"  # its presence marks a folder as a complete stage output (written last)
PATH_MAX = os.pathconf("/", "PC_PATH_MAX") if hasattr(os, "pathconf") else 4096


def partial_path(path: str | Path) -> Path:
    """The sibling that `path` is written as before it is renamed into place."""
    path = Path(path)
    return path.with_name(path.name + PARTIAL)


def _short(path: str | Path, keep: int = 48) -> str:
    text = str(path)
    return text if len(text) <= 2 * keep + 3 else f"{text[:keep]}...{text[-keep:]}"


def check_path_length(path: str | Path, what: str) -> Path:
    """`path` as a Path when every component fits the filesystem's NAME_MAX and the whole path fits PATH_MAX;
    otherwise a `RecipeError` naming `what`, the path (shortened) and the limit."""
    path = Path(path)
    encoded = os.fsencode(path)
    if len(encoded) >= PATH_MAX:
        raise RecipeError(
            f"{what} {_short(path)}: the path is {len(encoded)} bytes, more than PATH_MAX ({PATH_MAX}) allows: "
            f"choose a shorter path"
        )
    existing = path.absolute()
    while existing != existing.parent and not os.path.lexists(existing):
        existing = existing.parent
    try:
        name_max = os.pathconf(existing if existing.is_dir() else existing.parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        name_max = 255
    for part in path.parts:
        if len(os.fsencode(part)) > name_max:
            raise RecipeError(
                f"{what} {_short(path)}: the name '{_short(part, 16)}' is {len(os.fsencode(part))} bytes, over the "
                f"limit of {name_max} (NAME_MAX of this filesystem): choose a shorter name"
            )
    return path


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
    `path` is too long, is a file, something on its way is a file, or the nearest existing folder is read-only (a
    read-only mount, or permissions). Call it before any work, so a bad output location is not found after hours."""
    path = check_path_length(path, what)
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


def complete_stage(folder: str | Path) -> dict | None:
    """`{"stage", "finished_at"}` of the complete output in `folder` (its manifest is there), else None. A manifest
    that is not a JSON object still marks the folder as complete (stage '?'): it is never written over silently."""
    path = Path(folder) / MANIFEST
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = None
    record = record if isinstance(record, dict) else {}
    return {"stage": record.get("stage", "?"), "finished_at": record.get("finished_at", "?")}


def _within(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


def check_output_dir(
    path: str | Path, overwrite: bool = False, what: str = "output_dir", inputs: Iterable[tuple[str, str]] = ()
) -> Path:
    """The output-folder rule, checked before any work (writes nothing): `path` must be a usable location
    (`check_output_location`); it must not hold a complete output of any stage unless `overwrite`; and it must be
    none of `inputs` (`(name, path)` pairs) and hold none of them, since replacing it would destroy that input."""
    path = check_output_location(path, what)
    for name, source in inputs:
        if source and os.path.exists(source) and _within(Path(source), path):
            where = f"is {name} itself" if Path(source).resolve() == path.resolve() else f"holds {name} {source}"
            raise RecipeError(f"{what} {path} {where}: a stage never writes over its own input; choose another {what}")
    done = complete_stage(path)
    if done is not None and not overwrite:
        raise RecipeError(
            f"{what} {path} holds a complete '{done['stage']}' output ({MANIFEST}, finished {done['finished_at']}): "
            f"choose another {what}, or pass --overwrite true to replace it"
        )
    return path


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def retract_manifest(folder: str | Path) -> bool:
    """Remove `folder`'s manifest, durably (the folder is fsynced), so that nothing written after it can be taken
    for part of the complete output it described. Returns whether there was one."""
    folder = Path(folder)
    try:
        (folder / MANIFEST).unlink()
    except FileNotFoundError:
        return False
    _fsync_dir(folder)
    return True


def claim_output_dir(
    path: str | Path, overwrite: bool = False, what: str = "output_dir", inputs: Iterable[tuple[str, str]] = ()
) -> Path:
    """For stages that write into their output folder in place (training): call it just before the first byte.
    The rule again (`check_output_dir`); then a complete output there (only possible with `overwrite`) is emptied,
    its manifest first, so the run starts from scratch (that output's checkpoints are not resumed) and a kill at any
    later moment leaves nothing complete-looking. A folder without a manifest is kept as it is: an interrupted run
    resumes there, also when the same command (with `--overwrite`) is requeued."""
    path = check_output_dir(path, overwrite, what, inputs)
    if retract_manifest(path):
        empty_folder(path)
    return path


def empty_folder(path: str | Path, keep: Iterable[str] = ()) -> None:
    """Remove everything in `path` but the entries named in `keep` (a lock file its owner holds open). Retract the
    folder's manifest first (`retract_manifest`) when it has one."""
    for child in Path(path).iterdir():
        if child.name in keep:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def swap_in_folder(tmp: str | Path, path: str | Path) -> None:
    """Put the finished folder `tmp` at `path`. A folder already there loses its manifest first, then is renamed
    aside and removed, so at every moment `path` is the old complete output, absent, or the new complete one."""
    if not path.exists():
        os.replace(tmp, path)
        return
    aside = path.with_name(path.name + ASIDE)
    shutil.rmtree(aside, ignore_errors=True)
    retract_manifest(path)
    os.rename(path, aside)
    os.replace(tmp, path)
    shutil.rmtree(aside, ignore_errors=True)


def check_replaceable(
    path: str | Path, overwrite: bool = False, what: str = "output_dir", inputs: Iterable[tuple[str, str]] = ()
) -> Path:
    """`check_output_dir`, and for an output written whole (`atomic_output_dir`, not a resumable training folder):
    a non-empty folder at `path` that is no finished output is refused unless `overwrite`, since replacing it would
    delete files no stage of ours wrote."""
    path = check_output_dir(path, overwrite, what, inputs)
    if path.is_dir() and any(path.iterdir()) and not overwrite and complete_stage(path) is None:
        raise RecipeError(
            f"{what} {path} exists and holds files but no finished output: choose another {what}, or pass "
            "--overwrite true to replace it"
        )
    return path


@contextlib.contextmanager
def atomic_output_dir(
    path: str | Path, overwrite: bool = False, inputs: Iterable[tuple[str, str]] = (), what: str = "output_dir"
) -> Iterator[Path]:
    """Yield `path.partial` (fresh and empty) to build a folder in; on a clean exit it becomes `path`.

    The output-folder rule applies (`check_output_dir`): a complete output at `path` is replaced only with
    `overwrite=True`, and stays in place, complete, until the new one is (then it is swapped out, manifest first).
    A folder at `path` that holds files but no finished output (someone's own files) is refused too unless
    `overwrite` (`check_replaceable`). On an exception the partial folder is removed and `path` is untouched; a full
    disk is reported naming `path` (`naming_write_failures`).
    """
    inputs = list(inputs)
    path = check_replaceable(path, overwrite, what, inputs)
    tmp = partial_path(path)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(path.with_name(path.name + ASIDE), ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with naming_write_failures(path, "writing the output"):  # a full disk: one line naming the folder
            yield tmp
        check_output_dir(path, overwrite, what, inputs)  # a complete output that appeared meanwhile is kept
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    swap_in_folder(tmp, path)


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
