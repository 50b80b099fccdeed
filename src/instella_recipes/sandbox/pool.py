"""Run untrusted generated programs: the security boundary of the synthetic-data pipeline.

Isolation is the kernel's, set up by bubblewrap (Debian package `bubblewrap`), not Python tricks:
- own network namespace (only a private loopback: nothing on the host, 127.0.0.1 included, is reachable),
- own pid, ipc, uts and cgroup namespaces; the sandbox dies with its parent; the worker is the namespace's pid 1
  (no bubblewrap init holding copies of the host's pipes) and not dumpable (see below),
- a minimal read-only filesystem: the system libraries and the Python standard library only (no /work, /home,
  /root, /etc, no project tree, no host /tmp); a fresh size-capped tmpfs on /tmp is the only writable place,
- all capabilities dropped except the four the worker needs to drop each program to its own unprivileged uid (uids
  leased per run, `uids.py`: two runs on a host never share one), and no_new_privs (set by bubblewrap), so no
  setuid binary or file capability can give any back,
- per program (in `worker.py`): a forked child with rlimits on address space, CPU time, processes,
  file size and open files, a seccomp filter (sockets, exec, ptrace kill it), a wall-clock limit, an output cap, and
  its process group killed at the end.

The verdict cannot be forged by the program (see worker.py): the host's pipes to a worker are held only by
that worker, which no program can open through /proc, ptrace or signal (another uid as root; not dumpable and
its namespace's init otherwise), and each reply must carry the id of its request. Inside, what the program's process
writes on its result pipe counts only if the run ended the harness's way with exactly one record per call; a program
that writes records of its own is reported `tampered`, and a forbidden action is judged from outside the
program's process (the kernel's SIGSYS, the audit hook's exit status), never from a record it could write.

Without bubblewrap the pool refuses to start (`SandboxUnavailable`) unless the caller explicitly chooses
`mode="rlimits-only"`, which keeps the per-program rlimits, uid drop and audit hook but has NO filesystem or
network isolation: only for trusted models on a throwaway machine.

A pool of long-lived sandboxed workers gives throughput: each worker is one bubblewrap sandbox that forks a fresh
child per program, so the sandbox and interpreter start is paid once per worker instead of once per program
(benchmarks/bench_sandbox.py: ~11x the throughput).
"""

import ast
import hashlib
import json
import os
import queue
import select
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .uids import UID_BLOCK, UidLease, UidsUnavailable

WORKER = Path(__file__).with_name("worker.py")
MODES = ("bwrap", "rlimits-only")
# Dedicated unprivileged uids for programs when the pipeline runs as root: one per worker, leased per run from this
# base up (uids.py), so the per-uid process limit and the kill-everything-of-this-uid sweep only ever concern that
# worker's programs, and no program can signal another run's.
DEFAULT_UID_BASE = 1_900_000_000


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be set up; nothing was run (fail closed)."""


@dataclass
class SandboxConfig:
    """Limits for each program, and how many warm workers to keep."""

    mode: str = "bwrap"
    workers: int = 4  # warm sandboxes; 2 per core keeps the cores busy while others wait on pipes
    wall_seconds: float = 30.0  # the published limit
    cpu_seconds: float = 30.0
    memory_mb: int = 1024
    max_processes: int = 1  # tasks (processes + threads) a program may have, itself included
    max_output_bytes: int = 1 << 20
    max_file_bytes: int = 16 << 20
    tmpfs_bytes: int = 64 << 20
    uid_base: int = DEFAULT_UID_BASE  # as root: programs run as uids leased at or above this one (uids.py)
    # The audit hook names violations (forbidden_process, ...). Turning it off leaves the kernel's enforcement
    # alone; the escape tests do that to prove the isolation does not depend on the hook.
    audit_hook: bool = True
    bwrap_path: str | None = None  # default: `bwrap` on PATH

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {MODES}, got {self.mode!r}")
        if not 1 <= self.workers <= UID_BLOCK:
            raise ValueError(f"sandbox workers must be in 1..{UID_BLOCK}, got {self.workers}")


@dataclass
class ProgramResult:
    """One call of `answer(**params)`: `value` when ok, else a named `reason` (see worker.py)."""

    ok: bool
    value: float | int | None = None
    reason: str | None = None
    detail: str = ""


@dataclass
class RunReport:
    """One program run on several parameter sets. `reason` is set when the whole run failed (timeout, ...)."""

    reason: str | None
    detail: str
    results: list[ProgramResult] = field(default_factory=list)
    output: str = ""


def program_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def unbounded_loop(source: str) -> bool:
    """True when the program has a `while` loop on a constant true condition (`while True:`, `while 1:`). The
    published pipeline skips such programs; the sandbox's time limits catch the other infinite loops."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.While) and isinstance(node.test, ast.Constant) and bool(node.test.value):
            return True
    return False


def _python() -> tuple[str, list[str]]:
    """The real interpreter (not a venv shim) and the read-only roots programs may read: the standard library."""
    # private: the interpreter a venv's python points at; sys has no public name for it [test_private_apis]
    exe = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
    roots = {sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]}
    base = getattr(sys, "base_prefix", sys.prefix)
    roots = sorted({os.path.realpath(r) for r in roots if r and os.path.realpath(r).startswith(base)})
    return exe, roots


def _bwrap_args(bwrap: str, exe: str, roots: list[str], config: SandboxConfig, as_root: bool) -> list[str]:
    # --as-pid-1: the worker is the pid namespace's init. Bubblewrap's own init would otherwise sit in the sandbox
    # holding copies of the host's pipes, and when programs share the worker's uid (unprivileged) they could write a
    # forged reply into them through /proc/1/fd. An init also cannot be killed from inside its namespace.
    args = [bwrap, "--die-with-parent", "--new-session", "--as-pid-1", "--unshare-net", "--unshare-pid"]
    args += ["--unshare-ipc"]
    args += ["--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox", "--clearenv"]
    if not as_root:
        # Unprivileged: a user namespace is how bubblewrap gets the others; programs keep the caller's uid.
        args += ["--unshare-user", "--disable-userns"]
    # System libraries (for the dynamic loader and libc), read-only; symlinks (merged /usr) recreated as symlinks.
    for top in ("/usr", "/lib", "/lib64", "/lib32", "/bin"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    base = getattr(sys, "base_prefix", sys.prefix)
    if not base.startswith("/usr/"):
        # bubblewrap copies the modes of the parents it creates (/root is 0700): make them traversable.
        parents = [p for p in Path(base).parents if str(p) != "/"]
        for parent in reversed(parents):
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", base, base]
    args += ["--ro-bind", str(WORKER), "/sandbox/worker.py"]
    args += ["--proc", "/proc", "--dev", "/dev", "--size", str(config.tmpfs_bytes), "--tmpfs", "/tmp"]
    args += ["--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--chdir", "/tmp"]
    args += ["--cap-drop", "ALL"]
    if as_root:
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_CHOWN", "CAP_KILL"):
            args += ["--cap-add", cap]
    return args + ["--", exe, "-I", "-S", "-B", "/sandbox/worker.py"]


class _Worker:
    """One warm worker process (a bubblewrap sandbox running worker.py)."""

    def __init__(self, command: list[str], timeout: float, index: int, pass_fds: tuple[int, ...] = ()):
        self.command, self.index = command, index
        # stderr goes to a file, not a pipe nobody drains (a full pipe would block the worker).
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.errors, close_fds=True,
            pass_fds=pass_fds,
        )  # fmt: skip
        ready = self._read_line(timeout)
        if ready is None or not ready.get("ready"):
            err = self._stderr()
            self.close()
            raise SandboxUnavailable(f"the sandbox worker did not start: {err or 'no reply'} (command: {command[0]})")

    def _stderr(self) -> str:
        try:
            self.proc.kill()
            self.proc.wait(timeout=5)
            self.errors.seek(0)
            return self.errors.read().decode(errors="replace").strip()[-500:]
        except Exception:
            return ""

    def _read_line(self, timeout: float) -> dict | None:
        fd = self.proc.stdout.fileno()
        ready, _, _ = select.select([fd], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def request(self, payload: dict, timeout: float) -> dict | None:
        """Send one request; its reply, or None when the worker died, hung or answered out of turn (the caller
        restarts it). A reply must carry the request's id and the harness's shape: one line that is anything else
        means the stream is not the worker's, and nothing on it is believed."""
        try:
            self.proc.stdin.write((json.dumps(payload) + "\n").encode())
            self.proc.stdin.flush()
            reply = self._read_line(timeout)
        except (OSError, ValueError):
            return None
        if not isinstance(reply, dict) or reply.get("id") != payload["id"]:
            return None
        results = reply.get("results")
        if not isinstance(results, list) or len(results) != len(payload["calls"]):
            return None
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.errors):
            try:
                stream.close()
            except OSError:
                pass


class SandboxPool:
    """Warm sandboxed workers. `run(source, calls)` is thread-safe; `run_many` runs a batch on all workers.

    Use as a context manager (or call `close()`): the workers are killed on exit.
    """

    def __init__(self, config: SandboxConfig | None = None, *, one_shot: bool = False):
        self.config = config or SandboxConfig()
        self.one_shot = one_shot  # benchmark baseline: a new sandbox per program
        self.as_root = os.geteuid() == 0
        exe, self.read_roots = _python()
        if self.config.mode == "bwrap":
            bwrap = self.config.bwrap_path or shutil.which("bwrap")
            if not bwrap or not os.access(bwrap, os.X_OK):
                raise SandboxUnavailable(
                    "bubblewrap (`bwrap`) was not found, and generated programs are untrusted code: refusing to run "
                    "them. Install it (Debian/Ubuntu: `apt-get install -y bubblewrap`), or set "
                    "`sandbox: rlimits-only` to accept a WEAKER sandbox (per-program rlimits, no filesystem or "
                    "network isolation)."
                )
            self._prefix = _bwrap_args(bwrap, exe, self.read_roots, self.config, self.as_root)
        else:
            self._prefix = [exe, "-I", "-S", "-B", str(WORKER)]
        self._idle: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._next_id = 0
        self._workers: list[_Worker] = []
        self._lease: UidLease | None = None
        # As root, worker i runs its programs as uids[i], leased for this pool alone (uids.py).
        self.uids: list[int] = []
        try:
            if self.as_root:
                self._lease = UidLease(self.config.uid_base, self.config.workers)
                self.uids = self._lease.uids
            for index in range(self.config.workers):
                if one_shot:  # the free slots (and so uids) of the sandboxes started per program
                    self._idle.put(index)
                else:
                    worker = self._start(index)
                    self._workers.append(worker)
                    self._idle.put(worker)
        except UidsUnavailable as err:
            self.close()
            raise SandboxUnavailable(str(err)) from None
        except BaseException:
            self.close()  # no half-started pool left behind
            raise

    def _limits(self, index: int) -> dict:
        limits = asdict(self.config)
        limits["read_roots"] = self.read_roots
        limits["uid"] = self.uids[index] if self.as_root else None
        limits["tmp_root"] = "/tmp/jobs" if self.config.mode == "bwrap" else None
        return limits

    def _start(self, index: int) -> _Worker:
        # The workers hold the uid lease too: it outlives this process for as long as any of them may run programs.
        lease = (self._lease.fd,) if self._lease is not None else ()
        try:
            return _Worker(self._prefix + [json.dumps(self._limits(index))], 30, index, pass_fds=lease)
        except OSError as err:
            raise SandboxUnavailable(f"could not start the sandbox ({self._prefix[0]}): {err}") from None

    def run(self, source: str, calls: list[dict]) -> RunReport:
        """Run `source` once and call `answer(**params)` for each params dict in `calls`."""
        with self._lock:
            self._next_id += 1
            payload = {"id": self._next_id, "source": source, "calls": calls}
        timeout = self.config.wall_seconds + 30  # the worker enforces the limit; this only catches a hung worker
        if self.one_shot:
            index = self._idle.get()  # a free slot: overlapping one-shot sandboxes never share a uid
            try:
                worker = self._start(index)
                try:
                    reply = worker.request(payload, timeout)
                finally:
                    worker.close()
            finally:
                self._idle.put(index)
        else:
            worker = self._idle.get()
            reply = worker.request(payload, timeout)
            if reply is None:  # the worker died, hung or answered out of turn: replace it, report a crash
                worker.close()
                worker = self._start(worker.index)
                with self._lock:
                    self._workers[worker.index] = worker
            self._idle.put(worker)
        if reply is None:
            detail = "the sandbox worker died or hung"
            return RunReport("crashed", detail, [ProgramResult(False, None, "crashed", detail) for _ in calls])
        results = [
            ProgramResult(r["ok"], r.get("value"), r.get("reason"), r.get("detail", "")) for r in reply["results"]
        ]
        return RunReport(reply["reason"], reply["detail"], results, reply.get("output", ""))

    def run_many(self, jobs: list[tuple[str, list[dict]]]) -> list[RunReport]:
        """Run (source, calls) jobs on all workers at once; results in input order."""
        threads = self.config.workers
        with ThreadPoolExecutor(max_workers=threads) as executor:
            return list(executor.map(lambda job: self.run(*job), jobs))

    def close(self) -> None:
        for worker in self._workers:
            worker.close()
        self._workers = []
        if self._lease is not None:  # after the workers: no program runs under these uids any more
            self._lease.release()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_sandbox(config: SandboxConfig) -> None:
    """Start a pool and run one trivial program: raises `SandboxUnavailable` when isolation does not work."""
    with SandboxPool(SandboxConfig(**{**asdict(config), "workers": 1})) as pool:
        report = pool.run("def answer(x):\n    return x + 1\n", [{"x": 1}])
    if report.reason or not report.results[0].ok or report.results[0].value != 2:
        raise SandboxUnavailable(f"the sandbox runs but a trivial program failed: {report}")


def main() -> None:  # python -m instella_recipes.sandbox: a quick self-check
    start = time.perf_counter()
    check_sandbox(SandboxConfig())
    print(f"sandbox ok ({time.perf_counter() - start:.2f}s)")
