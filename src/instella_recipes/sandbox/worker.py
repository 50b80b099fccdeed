"""The process that runs untrusted programs, inside the sandbox. Standard library only: it is started as
`python -I -S worker.py '<limits json>'` inside bubblewrap (or bare, in the weaker `rlimits-only` mode).

Protocol on stdin/stdout: one JSON request per line `{"id", "source", "calls": [{param: value}, ...]}`, one JSON
reply per line `{"id", "reason", "detail", "results": [{"ok", "value" | "reason", "detail"}, ...], "output"}`.

Each request runs in a fresh forked child (copy-on-write) that, before touching the program:
- starts its own session and process group (so the whole group is killed afterwards),
- keeps only stdin (/dev/null), stdout/stderr (the output pipe) and its result pipe: every other descriptor it
  inherited is closed,
- gets a private empty working directory,
- sets rlimits: address space (RLIMIT_AS), CPU seconds, processes/threads (RLIMIT_NPROC), file size, open files,
  no core dumps,
- drops to an unprivileged uid when the worker runs as root (rlimits on processes do not bind root),
- installs an audit hook (PEP 578) that refuses process creation, sockets, native code and file access outside its
  directory. The hook only gives the rejection its precise name: the enforcement is the kernel's (namespaces, mounts,
  rlimits, uid), which holds even if a program gets past the hook.
The worker reads the child's stdout+stderr up to a byte cap and kills the process group on wall-clock timeout, on
output overflow, and always at the end.

The verdict. The program and the harness code that reports its results share one process, so nothing in that
process is secret from the program (a key in its memory can be read, the harness's functions replaced): records on
the result pipe cannot be authenticated, and the value of each call is the program's to choose in any case (it could
return any number). What is enforced is everything else, by the worker from outside that process:
- a run counts only if it ended the harness's way: exit status 0, not killed, no fatal record, and exactly one
  well-formed record per call, in the harness's own shapes and nothing else on the pipe. Otherwise every call of the
  run fails with the run's reason, so no record written before a timeout, a crash or a kill is believed;
- a program that writes records of its own (through any inherited or reopened descriptor) adds to the harness's and
  the run is reported `tampered`; it can only avoid that by writing exactly the records the harness would and
  exiting 0 itself, i.e. by answering, which returning the same numbers would do;
- the host's pipes to this worker are out of reach: the child does not inherit them (stdin/stdout are replaced),
  and this worker is not dumpable and its namespace's init (bubblewrap `--as-pid-1`), so a program with the same
  uid cannot open /proc/<worker>/fd/*, read its memory, ptrace or kill it; as root, programs have another uid anyway.
"""

import fractions  # imported here, once, so each forked child has it (and `numbers`) without reading files
import json
import math
import numbers
import os
import resource
import select
import shutil
import signal
import sys
import tempfile
import time

# Reasons (the host maps them onto rejection counters).
OK = None
TIMEOUT = "timeout"
CPU_LIMIT = "cpu_limit"
MEMORY = "memory"
OUTPUT_LIMIT = "output_limit"
EXCEPTION = "exception"
SYNTAX = "syntax_error"
NO_FUNCTION = "no_answer_function"
NON_NUMERIC = "non_numeric"
CRASHED = "crashed"
FORBIDDEN_PROCESS = "forbidden_process"
FORBIDDEN_NETWORK = "forbidden_network"
FORBIDDEN_FILE = "forbidden_file"
FORBIDDEN_NATIVE = "forbidden_native"
DENIED = "sandbox_denied"
TAMPERED = "tampered"  # the result pipe held something the harness did not write: the program wrote on it

RESULT_FD = 3  # the child's result pipe
_PROCESS_EVENTS = ("os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen")
_PROCESS_EVENTS += ("os.kill", "os.killpg", "pty.spawn", "os.startfile", "os.setuid")


class SandboxViolation(BaseException):
    """Raised by the audit hook. A BaseException so that `except Exception` in a program does not swallow it."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def _install_audit_hook(workdir: str, read_roots: tuple[str, ...], violations: list) -> None:
    workdir = workdir.rstrip("/") + "/"

    def inside(path, roots) -> bool:
        path = os.path.abspath(os.path.join(workdir, os.fsdecode(path)))
        return any(path == root.rstrip("/") or path.startswith(root.rstrip("/") + "/") for root in roots)

    def hook(event, args):
        reason = None
        if event.startswith(_PROCESS_EVENTS):
            reason = FORBIDDEN_PROCESS
        elif event.startswith("socket."):
            reason = FORBIDDEN_NETWORK
        elif event.startswith("ctypes.") or event == "mmap.__new__" and args and args[0] != -1:
            reason = FORBIDDEN_NATIVE
        elif event == "open" and args and isinstance(args[0], (str, bytes)):
            path, mode, flags = args[0], args[1], args[2]
            writing = (mode is not None and any(c in mode for c in "wax+")) or (
                mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)
            )
            if not inside(path, (workdir,)) and (writing or not inside(path, read_roots)):
                reason = FORBIDDEN_FILE
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod"):
            if args and isinstance(args[0], (str, bytes)) and not inside(args[0], (workdir,)):
                reason = FORBIDDEN_FILE
        if reason is not None:
            detail = f"{event} {str(args)[:200]}"
            violations.append((reason, detail))
            raise SandboxViolation(reason, detail)

    sys.addaudithook(hook)


def _number(value):
    """The program's return value as a JSON number, or None when it is not a finite real number. Huge ints are
    compared as floats (and are no answer beyond the float range); a Fraction with denominator 1 is an int."""
    if isinstance(value, bool):
        return None
    try:
        if isinstance(value, int) and abs(value) <= 2**53:
            return int(value)
        if isinstance(value, fractions.Fraction) and value.denominator == 1 and abs(value) <= 2**53:
            return int(value)
        if isinstance(value, numbers.Real):
            value = float(value)
            return value if math.isfinite(value) else None
    except (TypeError, ValueError, OverflowError):
        return None
    return None


def _child(request: dict, limits: dict, workdir: str, result_fd: int, out_fd: int, uid: int | None) -> None:
    """Runs in the forked child. Never returns: ends with os._exit."""
    try:
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        # Only 0, 1, 2 and the result pipe (moved to 3) stay open: not the uid lease, nor anything else inherited.
        os.dup2(result_fd, RESULT_FD)
        result_fd = RESULT_FD
        os.closerange(RESULT_FD + 1, os.sysconf("SC_OPEN_MAX"))
        mem = int(limits["memory_mb"]) << 20
        cpu = int(math.ceil(limits["cpu_seconds"]))
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits["max_file_bytes"],) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.chdir(workdir)  # after the uid drop: the directory belongs to the program's uid, mode 0700
        nproc = int(limits["max_processes"]) + int(limits.get("nproc_baseline", 0))
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.stdout
    except BaseException as err:  # the sandbox could not be set up: never run the program then
        import traceback

        tb = traceback.format_exc(limit=3)
        os.write(result_fd, (json.dumps({"fatal": f"child setup failed: {err!r} {tb}"}) + "\n").encode())
        os._exit(3)

    def emit(record: dict) -> None:
        os.write(result_fd, (json.dumps(record) + "\n").encode())

    violations: list = []
    try:
        if limits.get("audit_hook", True):
            _install_audit_hook(workdir, tuple(limits["read_roots"]), violations)
        namespace = {"__name__": "__sandbox__", "math": math, "__builtins__": __builtins__}
        try:
            code = compile(request["source"], "<program>", "exec")
        except (SyntaxError, ValueError) as err:
            emit({"fatal_reason": SYNTAX, "detail": str(err)[:300]})
            os._exit(0)
        exec(code, namespace)
        function = namespace.get(limits.get("function", "answer"))
        if not callable(function):
            emit({"fatal_reason": NO_FUNCTION, "detail": "the program defines no function answer(...)"})
            os._exit(0)
        for params in request["calls"]:
            try:
                value = function(**params)
                number = _number(value)
                if violations:
                    reason, detail = violations[0]
                    emit({"ok": False, "reason": reason, "detail": detail})
                elif number is None:
                    emit({"ok": False, "reason": NON_NUMERIC, "detail": f"returned {type(value).__name__}"})
                else:
                    emit({"ok": True, "value": number})
            except SandboxViolation as err:
                emit({"ok": False, "reason": err.reason, "detail": str(err)[:300]})
            except MemoryError:
                emit({"ok": False, "reason": MEMORY, "detail": "MemoryError"})
            except OSError as err:
                reason, detail = violations[0] if violations else (DENIED, repr(err)[:300])
                emit({"ok": False, "reason": reason, "detail": detail})
            except Exception as err:  # the program's own bug: counted, never fatal to the worker
                reason = violations[0][0] if violations else EXCEPTION
                emit({"ok": False, "reason": reason, "detail": f"{type(err).__name__}: {err}"[:300]})
    except SandboxViolation as err:
        emit({"fatal_reason": err.reason, "detail": str(err)[:300]})
    except MemoryError:
        emit({"fatal_reason": MEMORY, "detail": "MemoryError"})
    except BaseException as err:
        reason = violations[0][0] if violations else (DENIED if isinstance(err, OSError) else EXCEPTION)
        emit({"fatal_reason": reason, "detail": f"{type(err).__name__}: {err}"[:300]})
    try:
        sys.stdout.flush()
    except BaseException:
        pass
    os._exit(0)


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_uid(uid: int) -> None:
    """Kill every process left running as the sandbox uid (programs that escaped their process group)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            os.kill(-1, signal.SIGKILL)  # all processes this uid may signal, except this one
        except BaseException:
            pass
        os._exit(0)
    os.waitpid(pid, 0)


def _empty_folder(path: str) -> None:
    """Remove everything under `path`, first giving the owner back rwx on folders the program locked (chmod 000);
    symlinks are removed, never followed."""
    os.chmod(path, 0o700)
    for root, dirs, _files in os.walk(path):
        for name in dirs:
            child = os.path.join(root, name)
            if not os.path.islink(child):
                os.chmod(child, 0o700)
    for entry in os.listdir(path):
        child = os.path.join(path, entry)
        if os.path.isdir(child) and not os.path.islink(child):
            shutil.rmtree(child)
        else:
            os.unlink(child)


def _remove_workdir(workdir: str, uid: int | None) -> None:
    """Remove a program's folder, so nothing of it reaches a later program and the worker's tmpfs never fills up.

    The worker runs as root without CAP_DAC_OVERRIDE, so it cannot enter the program's 0700 folder: the folder is
    emptied by a child that takes the program's uid (the owner of everything in it), then the worker removes the
    empty folder from its own `tmp_root`."""
    if uid is None:
        _empty_folder(workdir)
    else:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                _empty_folder(workdir)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise OSError(f"could not empty the program folder {workdir} (status {status})")
    os.rmdir(workdir)


def run_one(request: dict, limits: dict, uid: int | None, tmp_root: str) -> dict:
    """Run one request in a fresh child and return the reply (see module docstring)."""
    workdir = tempfile.mkdtemp(prefix="job-", dir=tmp_root)
    if uid is not None:
        os.chown(workdir, uid, uid)
    result_r, result_w = os.pipe()
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(result_r)
        os.close(out_r)
        _child(request, limits, workdir, result_w, out_w, uid)
    os.close(result_w)
    os.close(out_w)
    deadline = time.monotonic() + float(limits["wall_seconds"])
    cap = int(limits["max_output_bytes"])
    output, results, killed_for = bytearray(), bytearray(), None
    open_fds = {out_r, result_r}
    while open_fds:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            killed_for = TIMEOUT
            break
        ready, _, _ = select.select(list(open_fds), [], [], remaining)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                open_fds.discard(fd)
            elif fd == out_r:
                output += chunk[: max(0, cap - len(output) + 1)]
                if len(output) > cap:
                    killed_for = OUTPUT_LIMIT
            else:
                results += chunk
                if len(results) > 1 << 20:
                    killed_for = OUTPUT_LIMIT
        if killed_for:
            break
    _kill_group(pid)
    _, status = os.waitpid(pid, 0)
    if uid is not None and int(limits["max_processes"]) > 1:
        # With one task allowed the program cannot have made another process, so nothing can have left the group.
        _reap_uid(uid)
    os.close(out_r)
    os.close(result_r)
    _remove_workdir(workdir, uid)
    return _reply(request, results, output, status, killed_for)


def _no_constant(name: str):
    raise ValueError(f"{name} is not a record value")


def _record(line: bytes) -> dict | None:
    """One result-pipe line as the harness writes it (`emit` in `_child`), or None for anything else."""
    try:
        record = json.loads(line, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    keys, text = set(record), lambda key: isinstance(record.get(key), str)
    if keys == {"ok", "value"} and record["ok"] is True:
        value = record["value"]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return record if number and _number(value) == value else None
    if keys == {"ok", "reason", "detail"} and record["ok"] is False and text("reason") and text("detail"):
        return record
    if (keys == {"fatal_reason", "detail"} and text("fatal_reason") and text("detail")) or (
        keys == {"fatal"} and text("fatal")
    ):
        return record
    return None


def parse_records(results: bytes, calls: int) -> tuple[list[dict], dict | None] | None:
    """The harness's records on a result pipe: at most `calls` call records, then at most one fatal record, each a
    whole line. None when the pipe holds anything else (a stray or partial line, one record too many, a record after
    the fatal one): someone besides the harness wrote on it."""
    if results and not results.endswith(b"\n"):
        return None
    records, fatal = [], None
    for line in results.splitlines():
        record = _record(line)
        if record is None or fatal is not None:
            return None
        if "ok" in record:
            records.append(record)
        else:
            fatal = record
    return (records, fatal) if len(records) <= calls else None


def _reply(request: dict, results: bytes, output: bytes, status: int, killed_for: str | None) -> dict:
    """The verdict: the calls' records when the run ended the harness's way, else every call fails with the run's
    reason (see the module docstring: nothing the program's process wrote is believed unless the run is whole)."""
    n_calls = len(request["calls"])
    parsed = parse_records(bytes(results), n_calls)
    reply = {"id": request.get("id"), "reason": None, "detail": "", "output": output[:200].decode("utf-8", "replace")}
    calls, fatal = parsed if parsed is not None else ([], None)
    if killed_for:
        reply["reason"], reply["detail"] = killed_for, f"killed by the worker ({killed_for})"
    elif parsed is None:
        reply["reason"] = TAMPERED
        reply["detail"] = "the result pipe held records the harness did not write (the program wrote on it)"
    elif fatal is not None:
        reply["reason"] = fatal.get("fatal_reason", CRASHED)
        reply["detail"] = fatal.get("detail", fatal.get("fatal", ""))
    elif os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        reply["reason"] = CPU_LIMIT if sig in (signal.SIGXCPU, signal.SIGKILL) else CRASHED
        reply["detail"] = f"killed by signal {signal.Signals(sig).name}"
    elif os.waitstatus_to_exitcode(status) != 0 or len(calls) < n_calls:
        reply["reason"], reply["detail"] = CRASHED, f"exit status {os.waitstatus_to_exitcode(status)}"
    if reply["reason"] is not None:
        failed = {"ok": False, "reason": reply["reason"], "detail": reply["detail"]}
        reply["results"] = [failed] * n_calls
    else:
        reply["results"] = calls
    return reply


def _tasks_of_uid(uid: int) -> int:
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                pass
    return count


def _not_dumpable() -> None:
    """prctl(PR_SET_DUMPABLE, 0): a process of our uid (a program, when programs keep our uid) can then no longer open
    /proc/<worker>/fd/* (the pipes to the host), read our memory or ptrace us; the kernel requires CAP_SYS_PTRACE.
    The os module has no prctl, hence ctypes (loaded before any program runs; programs are refused it)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(4, 0, 0, 0, 0) != 0:  # 4 = PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _reap_orphans() -> None:
    """As its namespace's init (bubblewrap --as-pid-1) the worker inherits the orphans of programs' children."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def main() -> None:
    limits = json.loads(sys.argv[1])
    uid = limits.get("uid")
    uid = int(uid) if uid is not None and os.geteuid() == 0 else None
    if uid is None:
        # Programs keep our uid (unprivileged bubblewrap or weaker mode): RLIMIT_NPROC counts every task of the uid
        # that we can see (in bubblewrap: this worker), so allow max_processes on top of those. Counted before we
        # become non-dumpable (which makes /proc show our files as root's).
        limits["nproc_baseline"] = _tasks_of_uid(os.getuid())
    _not_dumpable()
    # Programs may read what `import` reads: this interpreter's own module path (isolated mode: the stdlib only).
    roots = list(limits.get("read_roots", [])) + [p for p in sys.path if p and os.path.isabs(p)]
    limits["read_roots"] = sorted(set(roots) | {os.path.realpath(r) for r in roots})
    tmp_root = limits.get("tmp_root") or tempfile.gettempdir()
    os.makedirs(tmp_root, exist_ok=True)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    stdout.write(b'{"ready": true}\n')
    stdout.flush()
    for line in stdin:
        request = json.loads(line)
        try:
            reply = run_one(request, limits, uid, tmp_root)
            _reap_orphans()
        except Exception as err:  # a worker-side failure: report it, keep serving
            reply = {"id": request.get("id"), "reason": CRASHED, "detail": f"worker error: {err!r}", "results": []}
            reply["results"] = [{"ok": False, "reason": CRASHED, "detail": reply["detail"]}] * len(request["calls"])
        stdout.write((json.dumps(reply) + "\n").encode())
        stdout.flush()


if __name__ == "__main__":
    main()
