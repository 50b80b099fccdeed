"""Program uids leased per run, so that two runs on one host never share one.

As root, each sandbox worker drops its programs to a dedicated unprivileged uid: the per-uid task limit
(RLIMIT_NPROC) and the worker's "kill everything of this uid" sweep must only ever concern that worker's programs,
and a program must not be able to signal another run's programs. A uid fixed per host (base + worker index) is shared
by every run on the host, so each run leases a block of `UID_BLOCK` uids instead: block n is uids
[n * UID_BLOCK, (n + 1) * UID_BLOCK), held by an exclusive `flock` on `<lock dir>/block-<n>.lock`. The kernel drops
the lock when the last descriptor of it closes, so a killed holder frees its block without any clean-up (the lock
file stays, to be reused; removing lock files is what makes flock schemes racy). The pool passes the descriptor on to
its workers too, so a block stays leased while any process of the run may still run programs under it.

Standard library only, like the rest of the sandbox.
"""

import fcntl
import os
import socket
import stat
from pathlib import Path

UID_BLOCK = 256  # uids per lease: one per worker of a pool (SandboxConfig.workers <= UID_BLOCK)
MAX_BLOCKS = 4096  # blocks tried from the base before giving up (4096 concurrent runs on one host)
LOCK_DIR = Path("/run/instella-recipes/sandbox-uids")  # one per host, root's: only runs as root drop to uids
_MAX_UID = 2**32 - 2  # (uid_t)-1 means "no change" to setuid


class UidsUnavailable(RuntimeError):
    """No block of uids could be leased (lock folder unusable, or every block held)."""


def _lock_dir(path: Path) -> Path:
    """Create the lock folder (root's, mode 0700) and refuse one that someone else could write to: whoever can
    replace a lock file can make two runs lock different files for the same uids."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = path.lstat()
    except OSError as err:
        raise UidsUnavailable(f"cannot use the sandbox uid lock folder {path}: {err.strerror or err}") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise UidsUnavailable(
            f"the sandbox uid lock folder {path} must be a folder owned by uid {os.geteuid()} that no one else can "
            f"write to (it is owned by uid {info.st_uid}, mode {stat.filemode(info.st_mode)}): remove it and run again"
        )
    return path


def try_block(lock_dir: Path, block: int) -> int | None:
    """Lease block `block`: the open, flock'ed descriptor, or None when another process holds it."""
    fd = os.open(lock_dir / f"block-{block}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)  # who holds it, for a person looking at the folder
    os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
    return fd


class UidLease:
    """`count` uids, the first free block at or above `uid_base`, leased until `release()` (or the holder's death).

    `uids[i]` is the uid of worker i; `fd` is the lock's descriptor (pass it to processes that run programs)."""

    def __init__(self, uid_base: int, count: int, lock_dir: Path = LOCK_DIR):
        if not 0 < count <= UID_BLOCK:
            raise ValueError(f"a uid lease holds 1..{UID_BLOCK} uids, asked for {count}")
        lock_dir = _lock_dir(Path(lock_dir))
        first = -(-uid_base // UID_BLOCK)  # the first whole block at or above the base
        last = min(first + MAX_BLOCKS, (_MAX_UID + 1) // UID_BLOCK)
        for block in range(first, last):
            fd = try_block(lock_dir, block)
            if fd is not None:
                self.fd, self.block = fd, block
                self.uids = list(range(block * UID_BLOCK, block * UID_BLOCK + count))
                return
        raise UidsUnavailable(
            f"every sandbox uid block from uid {first * UID_BLOCK} on is leased ({last - first} blocks, lock folder "
            f"{lock_dir}): too many sandbox runs on this host, or set another uid_base"
        )

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
