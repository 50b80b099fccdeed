"""The one error type for bad user input, the failures of the machine, and the wrapper that turns both into a clear
exit.

Every check of a recipe, a data file, a checkpoint or a command-line value raises `RecipeError` with one line that
names the file (and line) or the field, and says what to do. Entry points wrap `main` in `exit_on_recipe_error`:
the user sees `error: <message>` on stderr and exit code 2, before any work has started and with no traceback.

The machine can fail a correct run too: a full disk, a denied permission, a path the filesystem cannot hold. Those
arrive as `OSError`s from deep inside a library (or, from torch's checkpoint writer, as a `RuntimeError` that names
neither the file nor the cause). The same wrapper prints them as one line naming the path and the cause, with exit
code 1 (the input was fine; fix the machine and run the same command again). Stages write their outputs aside or
write the manifest last, so such a failure leaves nothing that looks complete.
"""

import contextlib
import difflib
import errno
import functools
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator


class RecipeError(ValueError):
    """Bad user input (recipe, data, checkpoint). Entry points print it without a traceback and exit with 2.
    `every_rank=True`: every process of a launch finds the same mistake (the launch itself), so only the first
    process of each node prints it (one line, not one per process)."""

    every_rank = False

    def __init__(self, *args, every_rank: bool = False):
        super().__init__(*args)
        self.every_rank = every_rank


class EnvironmentFailure(OSError):
    """The machine failed a write or read (disk full, permission denied, ...): `EnvironmentFailure(errno, line)`,
    whose `str()` is that one line naming the path and the cause. Entry points print it and exit with 1."""

    def __str__(self) -> str:
        return self.strerror or super().__str__()


# errno -> what to do about it; any other OSError is a bug or an unexpected state and keeps its traceback
_ENVIRONMENT = {
    errno.ENOSPC: "the disk is full: free space there, or choose another output_dir, and run the same command again",
    errno.EDQUOT: "the disk quota is used up: free space (or raise the quota) and run the same command again",
    errno.EFBIG: "a file grew past this filesystem's or this process's file size limit (ulimit -f)",
    errno.EACCES: "permission denied: give this user access to it (chmod/chown), or run as its owner",
    errno.EPERM: "operation not permitted for this user: give it access, or run as the owner",
    errno.EROFS: "the filesystem is read-only: choose a writable place",
    errno.ENAMETOOLONG: "the name is longer than the filesystem allows (255 bytes a name, 4096 a path): shorten it",
    errno.EIO: "the storage reported an I/O error: check the disk or the network filesystem",
}
# torch's zip checkpoint writer (torch.save) reports a failed write this way, without the file or errno
_TORCH_WRITE_FAILURES = ("unexpected pos", "file write failed", "PytorchStreamWriter failed", "iostream error")


def describe_os_error(err: OSError) -> str | None:
    """One line naming the path and the cause of an environment failure, or None for any other `OSError`."""
    if isinstance(err, EnvironmentFailure):
        return str(err)
    hint = _ENVIRONMENT.get(err.errno)
    if hint is None:
        return None
    cause = f"{err.strerror or os.strerror(err.errno)} ({hint})"
    if err.filename is None:  # a write to an open file: wrap the writing code in `naming_write_failures`
        return cause
    if err.filename2 is not None:  # a copy or rename: the destination is where it failed
        return f"{err.filename2}: {cause} (from {err.filename})"
    return f"{err.filename}: {cause}"


def environment_cause(err: BaseException) -> OSError | None:
    """The failure of the machine (`describe_os_error` knows it) that `err` is or was raised from, if any: libraries
    wrap a full disk in their own errors (datasets' `DatasetGenerationError`), which a broad `except` must not turn
    into a bad-input message."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and describe_os_error(err) is not None:
            return err
        err = err.__cause__ or err.__context__
    return None


# Ctrl-C: the stages write their manifest last, so an interrupted output never looks complete, and the same command
# resumes it (training stages from their last checkpoint).
INTERRUPTED = "interrupted (Ctrl-C): nothing was marked complete; run the same command to resume"


def exit_on_recipe_error(main: Callable) -> Callable:
    """Wrap an entry point's `main(argv)`: called without arguments (as a script), it gets `sys.argv[1:]`, so what it
    records (a stage's manifest: command line and recipe) is the command that ran; a `RecipeError` becomes
    `error: <message>` on stderr and exit code 2; a failure of the machine (`describe_os_error`) becomes
    `error: <path>: <cause> (<what to do>)` and exit code 1; Ctrl-C one line and exit code 130 (`interrupted`)."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        if not args and "argv" not in kwargs:
            args = (sys.argv[1:],)
        try:
            return main(*args, **kwargs)
        except RecipeError as err:
            if not err.every_rank or os.environ.get("LOCAL_RANK", "0") == "0":
                print(f"error: {err}", file=sys.stderr)
            raise SystemExit(2) from None
        except KeyboardInterrupt:
            print(f"error: {INTERRUPTED}", file=sys.stderr)
            raise SystemExit(130) from None
        except Exception as err:
            cause = environment_cause(err)
            if cause is None:
                raise
            print(f"error: {describe_os_error(cause)}", file=sys.stderr)
            raise SystemExit(1) from None

    return wrapper


def _free_bytes(path: str | os.PathLike) -> int | None:
    path = os.fspath(path)
    while path and not os.path.isdir(path):
        path = os.path.dirname(path)
    try:
        stat = os.statvfs(path or ".")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def _errno_of(err: BaseException) -> int | None:
    """The errno behind a write failure that libraries report without one: torch's zip writer ("unexpected pos",
    "file write failed": ENOSPC when the disk is full, else EIO) and Rust writers (safetensors, tokenizers:
    "... (os error 28)")."""
    text = str(err)
    match = re.search(r"\(os error (\d+)\)", text)
    if match:
        return int(match.group(1))
    if any(marker in text for marker in _TORCH_WRITE_FAILURES):
        return errno.ENOSPC  # confirmed (or not) against the folder's free space by the caller
    return None


@contextlib.contextmanager
def naming_write_failures(folder: str | os.PathLike | Callable[[], str], what: str = "writing") -> Iterator[None]:
    """Around code that writes into `folder` (a path, or a function returning it once known): a failure of the
    machine that does not name its file becomes an `EnvironmentFailure` naming `folder`, `what` was being done and
    the cause. That covers an `OSError` without a file name (a write to an open file), torch's checkpoint writer
    ("unexpected pos ...") and the Rust writers of safetensors and tokenizers ("(os error 28)"). An error that names
    its file, and every other error, passes through unchanged (the entry point names the file)."""
    try:
        yield
    except Exception as err:
        number = err.errno if isinstance(err, OSError) and err.filename is None else _errno_of(err)
        if number not in _ENVIRONMENT or isinstance(err, EnvironmentFailure):
            raise
        where = os.fspath(folder() if callable(folder) else folder)
        free = _free_bytes(where)
        if number == errno.ENOSPC and free is not None and free >= (1 << 20):
            if not isinstance(err, OSError):  # torch's bare message, and the folder has room: not a full disk
                raise EnvironmentFailure(errno.EIO, f"{where}: {what} failed ({_last_line(err)})") from None
            line = (
                f"{what} failed: {os.strerror(number)}, but not in {where} ({free >> 20} MiB free there): another "
                f"filesystem is full (the datasets cache, TMPDIR?); free space and run the same command again"
            )
            raise EnvironmentFailure(number, line) from None
        raise EnvironmentFailure(
            number, f"{where}: {what} failed: {os.strerror(number)} ({_ENVIRONMENT[number]})"
        ) from None


def _last_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__


def did_you_mean(name: str, known: Iterable[str], otherwise: str = "remove it or check the spelling") -> str:
    """`did you mean 'x'?` for the known name closest to `name`, else `otherwise` (for error messages)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean '{close[0]}'?" if close else otherwise
