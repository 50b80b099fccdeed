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
- installs a seccomp filter: the kernel kills the process (SIGSYS) at a system call no program needs (sockets,
  exec, ptrace: `seccomp_installer`),
- installs an audit hook (PEP 578) that refuses process creation, sockets, native code and file access outside its
  directory by ending the process (exit status `VIOLATION_EXIT`, after one violation record). The hook only gives
  the rejection its precise name: the enforcement is the kernel's (namespaces, mounts, rlimits, uid, seccomp), which
  holds even if a program gets past the hook.
The worker reads the child's stdout+stderr up to a byte cap and kills the process group on wall-clock timeout, on
output overflow, and always at the end.

The verdict. The program and the harness code that reports its results share one process, so nothing in that
process is secret from the program (a key in its memory can be read, the harness's functions replaced): records on
the result pipe cannot be authenticated, and the value of each call is the program's to choose in any case (it could
return any number). What is enforced is everything else, by the worker from outside that process:
- a forbidden action is judged from outside: the kernel's SIGSYS, or the hook's exit status, which the worker reads
  from waitpid; the program cannot go on after either, so it cannot write a verdict over it;
- a run counts only if it ended the harness's way: exit status 0, not killed, no fatal record, and exactly one
  well-formed record per call, each followed by the harness's end-of-call marker, in the harness's own shapes and
  nothing else on the pipe. Otherwise every call of the run fails with the run's reason, so no record written before
  a timeout, a crash or a kill is believed;
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
FORBIDDEN_SYSCALL = "forbidden_syscall"  # the kernel killed the program at a system call no program needs
TAMPERED = "tampered"  # the result pipe held something the harness did not write: the program wrote on it

RESULT_FD = 3  # the child's result pipe
_PROCESS_EVENTS = ("os.system", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn", "subprocess.Popen")
_PROCESS_EVENTS += ("os.kill", "os.killpg", "pty.spawn", "os.startfile", "os.setuid")


VIOLATION_EXIT = 86  # the audit hook's exit status: the program tried a forbidden action (its record says which)
# Introspection that reaches the hook's own objects (to swap what it calls): refused like native code.
_INTROSPECTION_EVENTS = ("gc.get_objects", "gc.get_referrers", "gc.get_referents")
_FILE_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.chmod")


def _install_audit_hook(workdir: str, read_roots: tuple[str, ...], result_fd: int) -> None:
    """Refuse process creation, sockets, native code and file access outside `workdir`: at the first such event the
    hook writes one violation record on `result_fd` and ends the process with `VIOLATION_EXIT`, so the program never
    runs again once it tried (it cannot catch a refusal and go on to write its own verdict).

    The hook runs in the program's process, so it uses nothing the program could rebind: every function and constant
    it calls is bound here, before any program runs (not `os.path`, `any` or `json.dumps`, which a program can
    replace), it never calls the program's code (exact types only: no __repr__, __fspath__ or __class__ of theirs),
    anything going wrong inside it ends the process the same way (fail closed), and the ways to reach its own
    objects (ctypes, gc) are refused. What no hook can do, the kernel does: see `seccomp_installer`."""
    workdir = workdir.rstrip("/")
    roots = tuple(root.rstrip("/") for root in read_roots)
    write, exit_now, quote, kind_of, text = os.write, os._exit, json.encoder.encode_basestring_ascii, type, repr
    str_, bytes_, int_, decode = str, bytes, int, bytes.decode
    process, network, native, file_events = _PROCESS_EVENTS, FORBIDDEN_NETWORK, FORBIDDEN_NATIVE, _FILE_EVENTS
    introspection, forbid_process, forbid_file = _INTROSPECTION_EVENTS, FORBIDDEN_PROCESS, FORBIDDEN_FILE
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT

    def normal(path) -> str:
        """`path` (relative to the workdir) made absolute, with '.', '..' and repeated slashes resolved."""
        if kind_of(path) is bytes_:
            path = decode(path, "utf-8", "surrogateescape")
        parts = []
        for part in (path if path.startswith("/") else workdir + "/" + path).split("/"):
            if part == "..":
                parts = parts[:-1]
            elif part and part != ".":
                parts.append(part)
        return "/" + "/".join(parts)

    def inside(path, places) -> bool:
        path = normal(path)
        for place in places:
            if path == place or path.startswith(place + "/"):
                return True
        return False

    def described(args) -> str:
        parts = []
        for arg in args if kind_of(args) is tuple else ():
            kind = kind_of(arg)
            parts.append(text(arg) if kind in (str_, bytes_, int_) or arg is None else "<" + kind.__name__ + ">")
        return ", ".join(parts)[:200]

    def reason_of(event, args):
        if event.startswith(process):
            return forbid_process
        if event.startswith("socket."):
            return network
        if event.startswith("ctypes.") or event in introspection:
            return native
        if event == "mmap.__new__" and args and args[0] != -1:
            return native
        if event == "open" and args and kind_of(args[0]) in (str_, bytes_):
            mode, flags = args[1], args[2]
            writing = (kind_of(mode) is str_ and ("w" in mode or "a" in mode or "x" in mode or "+" in mode)) or (
                mode is None and kind_of(flags) is int_ and flags & write_flags
            )
            if not inside(args[0], (workdir,)) and (writing or not inside(args[0], roots)):
                return forbid_file
        elif event in file_events and args and kind_of(args[0]) in (str_, bytes_) and not inside(args[0], (workdir,)):
            return forbid_file
        return None

    def hook(event, args):
        try:
            reason = reason_of(event, args)
            if reason is None:
                return
            record = '{"violation": "' + reason + '", "detail": ' + quote(event + " (" + described(args) + ")")
            record = (record + "}\n").encode()
        except BaseException:  # the hook itself failed: fail closed, without a record (reported as tampering)
            record = b""
        try:
            write(result_fd, record)
        finally:
            exit_now(VIOLATION_EXIT)

    sys.addaudithook(hook)


# System calls no program needs, which the kernel answers by killing the process (SIGSYS): a verdict that reaches the
# worker from outside the program's process, whatever it does afterwards (it has no afterwards) and with no hook.
# Network (socket, socketpair), a new program image (execve, execveat), and reaching other processes' memory
# (ptrace, process_vm_readv, process_vm_writev). Numbers per architecture, from the kernel's syscall tables.
_KILLED_SYSCALLS = {
    # AUDIT_ARCH_X86_64; socket, socketpair, execve, ptrace, process_vm_readv, process_vm_writev, execveat
    "x86_64": (0xC000003E, (41, 53, 59, 101, 310, 311, 322)),
    # AUDIT_ARCH_AARCH64; socket, socketpair, ptrace, execve, process_vm_readv, process_vm_writev, execveat
    "aarch64": (0xC00000B7, (198, 199, 117, 221, 270, 271, 281)),
}
KILLED_SYSCALL_NAMES = "socket, socketpair, execve, execveat, ptrace, process_vm_readv, process_vm_writev"


def seccomp_installer():
    """A function that installs, in the calling process, the seccomp filter that kills it on `_KILLED_SYSCALLS`
    (with no_new_privs, which the kernel requires of an unprivileged filter). Built in the worker before any program
    runs (ctypes is refused to programs); a filter cannot be removed, and it holds in every thread and child.
    The os module has no seccomp or prctl, hence ctypes. Raises OSError on an architecture or kernel without it:
    the sandbox then does not start (fail closed)."""
    import ctypes  # only here: the worker's own setup, before any program (programs are refused ctypes)
    import struct

    machine = os.uname().machine
    if machine not in _KILLED_SYSCALLS:
        raise OSError(f"the sandbox's seccomp filter knows x86_64 and aarch64 only, not {machine}")
    arch, numbers_ = _KILLED_SYSCALLS[machine]
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, kill = 0x7FFF0000, 0x80000000  # SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS
    # seccomp_data: nr at offset 0, arch at offset 4. Another ABI (i386, x32) than the one listed is killed.
    code = [(ld_w_abs, 0, 0, 4), (jeq_k, 1, 0, arch), (ret_k, 0, 0, kill), (ld_w_abs, 0, 0, 0)]
    checks = [(jge_k, 0x40000000)] if machine == "x86_64" else []  # __X32_SYSCALL_BIT
    checks += [(jeq_k, nr) for nr in numbers_]
    for i, (op, value) in enumerate(checks):
        code.append((op, len(checks) - i, 0, value))  # true: jump over the rest and the allow, to the kill
    code += [(ret_k, 0, 0, allow), (ret_k, 0, 0, kill)]
    raw = b"".join(struct.pack("HBBI", *instruction) for instruction in code)
    buffer = ctypes.create_string_buffer(raw, len(raw))

    class Program(ctypes.Structure):  # struct sock_fprog
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    program = Program(len(code), ctypes.addressof(buffer))
    libc = ctypes.CDLL(None, use_errno=True)

    def install() -> None:
        keep = buffer  # the filter's memory lives as long as this function
        if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.prctl(22, 2, ctypes.byref(program), 0, 0) != 0 or keep is None:  # PR_SET_SECCOMP, FILTER
            raise OSError(ctypes.get_errno(), "the kernel refused the sandbox's seccomp filter")

    return install


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
        limits["seccomp"]()  # last: the setup above needs none of what it kills
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = sys.stdout
    except BaseException as err:  # the sandbox could not be set up: never run the program then
        import traceback

        tb = traceback.format_exc(limit=3)
        os.write(result_fd, (json.dumps({"fatal": f"child setup failed: {err!r} {tb}"}) + "\n").encode())
        os._exit(3)

    def emit(record: dict, end: int | None = None) -> None:
        """One record; a call's record is followed by the harness's end-of-call marker, in the same write."""
        line = json.dumps(record) + "\n" + (json.dumps({"end": end}) + "\n" if end is not None else "")
        os.write(result_fd, line.encode())

    try:
        if limits.get("audit_hook", True):
            _install_audit_hook(workdir, tuple(limits["read_roots"]), result_fd)
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
        for index, params in enumerate(request["calls"]):
            try:
                value = function(**params)
                number = _number(value)
                if number is None:
                    record = {"ok": False, "reason": NON_NUMERIC, "detail": f"returned {type(value).__name__}"}
                else:
                    record = {"ok": True, "value": number}
            except MemoryError:
                record = {"ok": False, "reason": MEMORY, "detail": "MemoryError"}
            except OSError as err:  # the kernel refused something (no hook, or past it)
                record = {"ok": False, "reason": DENIED, "detail": repr(err)[:300]}
            except Exception as err:  # the program's own bug: counted, never fatal to the worker
                record = {"ok": False, "reason": EXCEPTION, "detail": f"{type(err).__name__}: {err}"[:300]}
            emit(record, end=index)
    except MemoryError:
        emit({"fatal_reason": MEMORY, "detail": "MemoryError"})
    except BaseException as err:
        emit(
            {
                "fatal_reason": DENIED if isinstance(err, OSError) else EXCEPTION,
                "detail": f"{type(err).__name__}: {err}"[:300],
            }
        )
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
    if keys == {"end"} and type(record["end"]) is int:
        return record
    if keys == {"violation", "detail"} and text("violation") and text("detail"):
        return record
    if (keys == {"fatal_reason", "detail"} and text("fatal_reason") and text("detail")) or (
        keys == {"fatal"} and text("fatal")
    ):
        return record
    return None


def parse_records(results: bytes, calls: int) -> tuple[list[dict], dict | None] | None:
    """The harness's records on a result pipe: at most `calls` call records, each followed by the harness's
    end-of-call marker `{"end": <call index>}`, then at most one fatal or violation record, each a whole line. None
    when the pipe holds anything else (a stray or partial line, a call record without its marker, one record too
    many, a record after the last one): someone besides the harness wrote on it."""
    if results and not results.endswith(b"\n"):
        return None
    records, fatal, open_call = [], None, False
    for line in results.splitlines():
        record = _record(line)
        if record is None or fatal is not None:
            return None
        if "end" in record:
            if not open_call or record["end"] != len(records) - 1:
                return None
            open_call = False
        elif open_call:
            return None
        elif "ok" in record:
            records.append(record)
            open_call = True
        else:
            fatal = record
    return (records, fatal) if len(records) <= calls and not open_call else None


def _verdict(parsed, status: int, killed_for: str | None, n_calls: int) -> tuple[str | None, str]:
    """The run's reason and detail (None: every call has its record), decided from outside the program's process
    first: the worker's own kill, the kernel's (seccomp's SIGSYS, rlimits), the audit hook's exit status; only then
    what the result pipe holds."""
    calls, fatal = parsed if parsed is not None else ([], None)
    code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else None
    if killed_for:
        return killed_for, f"killed by the worker ({killed_for})"
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGSYS:
        return FORBIDDEN_SYSCALL, f"the kernel killed the program at a forbidden system call ({KILLED_SYSCALL_NAMES})"
    if code == VIOLATION_EXIT:
        if fatal is not None and "violation" in fatal:
            return fatal["violation"], fatal["detail"]
        return (
            TAMPERED,
            "the audit hook stopped the program but its record is missing or altered (the program wrote on it)",
        )
    if parsed is None or (fatal is not None and "violation" in fatal):
        return TAMPERED, "the result pipe held records the harness did not write (the program wrote on it)"
    if fatal is not None:
        return fatal.get("fatal_reason", CRASHED), fatal.get("detail", fatal.get("fatal", ""))
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return (
            CPU_LIMIT if sig in (signal.SIGXCPU, signal.SIGKILL) else CRASHED
        ), f"killed by signal {signal.Signals(sig).name}"
    if code != 0 or len(calls) < n_calls:
        return CRASHED, f"exit status {code}"
    return None, ""


def _reply(request: dict, results: bytes, output: bytes, status: int, killed_for: str | None) -> dict:
    """The verdict: the calls' records when the run ended the harness's way, else every call fails with the run's
    reason (see the module docstring: nothing the program's process wrote is believed unless the run is whole)."""
    n_calls = len(request["calls"])
    parsed = parse_records(bytes(results), n_calls)
    reply = {"id": request.get("id"), "reason": None, "detail": "", "output": output[:200].decode("utf-8", "replace")}
    reply["reason"], reply["detail"] = _verdict(parsed, status, killed_for, n_calls)
    if reply["reason"] is not None:
        failed = {"ok": False, "reason": reply["reason"], "detail": reply["detail"]}
        reply["results"] = [failed] * n_calls
    else:
        reply["results"] = parsed[0]
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
    limits["seccomp"] = seccomp_installer()
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
