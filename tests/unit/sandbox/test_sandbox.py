"""The sandbox is a security boundary: every escape attempt is contained (the host and the project tree are
unchanged, checked here) and reported under the right reason, and no program can forge its own verdict or another's.
Each attempt runs twice: with the audit hook that names the violation, and without it, to prove the kernel's
isolation holds on its own. Program uids are leased per run: tests look only at their own pool's."""

import json
import os
import select
import shutil
import threading
from pathlib import Path

import pytest

from instella_recipes.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable, check_sandbox, unbounded_loop
from tests.helpers.synthetic_fakes import BWRAP_PROBLEM

ROOT = Path(__file__).resolve().parents[3]
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))


def tree_state(root: Path) -> dict:
    """Every path under the project with its size and mtime: any write, creation or deletion changes it."""
    state = {}
    for dirpath, dirnames, filenames in os.walk(root):
        # .venv and .git/worktrees are left out: other processes on the machine (pip, a parallel pytest, git in a
        # linked worktree) may write there; the programs under test have no path to them that they lack to the rest
        # of the tree, which is all checked.
        skip = (".pytest_cache", "__pycache__", ".ruff_cache", ".venv")
        dirnames[:] = [
            d for d in dirnames if d not in skip and os.path.join(dirpath, d) != str(root / ".git" / "worktrees")
        ]
        for name in filenames + dirnames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            state[path] = (st.st_size, st.st_mtime_ns)
    return state


# A result record as the harness writes it, and a whole reply as the worker writes it to the host (for the next
# request: a worker that trusted its stream would hand it to whichever program ran next).
FORGED_RECORD = b'{"ok": true, "value": 777}\n'
FORGED_REPLY = b'{"id": %d, "reason": null, "detail": "", "results": [{"ok": true, "value": 777}], "output": ""}\n'
FORGE = f"import os\nRECORD = {FORGED_RECORD!r}\nREPLY = {FORGED_REPLY!r}\n"
# Every descriptor number the program could have inherited (3..1023), each written with a forged record.
FORGE_FDS = "def forge_fds():\n    for fd in range(3, 1024):\n        try:\n            os.write(fd, RECORD)\n"
FORGE_FDS += "        except OSError:\n            pass\n"
# The descriptors /proc lists, written to and reopened for writing by path.
FORGE_PROC = (
    "def forge_proc():\n    for name in os.listdir('/proc/self/fd'):\n        try:\n"
    "            os.write(int(name), RECORD)\n        except OSError:\n            pass\n"
    "        try:\n            fd = os.open('/proc/self/fd/' + name, os.O_WRONLY)\n            os.write(fd, RECORD)\n"
    "        except OSError:\n            pass\n"
)
# The host's pipes, through the parent's (the worker's) and pid 1's /proc entries; counts what it could open.
FORGE_HOST = (
    "def forge_host():\n    opened = 0\n    for pid in {os.getppid(), 1}:\n        for fd in range(20):\n"
    "            try:\n                f = os.open('/proc/%d/fd/%d' % (pid, fd), os.O_WRONLY)\n"
    "                os.write(f, b''.join(REPLY % i for i in range(1, 100)))\n                opened += 1\n"
    "            except OSError:\n                pass\n    return opened\n"
)
FORGERS = FORGE + FORGE_FDS + FORGE_PROC + FORGE_HOST


def test_fail_closed_without_bubblewrap(tmp_path, monkeypatch):
    with pytest.raises(SandboxUnavailable, match="apt-get install -y bubblewrap"):
        SandboxPool(SandboxConfig(bwrap_path=str(tmp_path / "no-bwrap")))
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap anywhere on PATH
    with pytest.raises(SandboxUnavailable, match="rlimits-only"):
        check_sandbox(SandboxConfig())


def test_fail_closed_when_bubblewrap_cannot_start(tmp_path):
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to creating new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    with pytest.raises(SandboxUnavailable, match="No permissions"):
        SandboxPool(SandboxConfig(bwrap_path=str(fake)))


def test_weaker_mode_is_explicit_and_still_limits(tmp_path):
    """`rlimits-only` runs without bubblewrap (opt-in), still with per-program limits and the uid drop."""
    config = SandboxConfig(mode="rlimits-only", wall_seconds=1.5, cpu_seconds=10, memory_mb=512, workers=1)
    with SandboxPool(config) as pool:
        assert pool.run("def answer(x):\n    return x + 1\n", [{"x": 1}]).results[0].value == 2
        assert pool.run("def answer():\n    bytearray(20 * 2**30)\n", [{}]).results[0].reason == "memory"
        assert pool.run("def answer():\n    while True:\n        pass\n", [{}]).reason == "timeout"
    with pytest.raises(ValueError, match="sandbox mode"):
        SandboxConfig(mode="none")


def test_unbounded_loop_detection():
    assert unbounded_loop("def answer():\n    while True:\n        return 1\n")
    assert unbounded_loop("def answer():\n    while 1:\n        break\n")
    assert not unbounded_loop("def answer(n):\n    while n > 0:\n        n -= 1\n    return n\n")
    assert not unbounded_loop("def answer(:")


NOBODY_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1] + "/src")
from instella_recipes.sandbox import SandboxConfig, SandboxPool
forgers = json.loads(sys.argv[2])
programs = [
    "def answer(a):\\n    return a * 2\\n",
    "import os\\ndef answer(a):\\n    while 1:\\n        os.fork()\\n",
    "def answer(a):\\n    open(%r, 'w').write('x')\\n    return 1\\n" % (sys.argv[1] + '/PWNED',),
    forgers + "def answer(a):\\n    forge_fds()\\n    return 1\\n",
    forgers + "def answer(a):\\n    forge_proc()\\n    return 1\\n",
    forgers + "def answer(a):\\n    return 1 + 1000 * forge_host()\\n",
    "def answer(a):\\n    return a * 3\\n",
]
with SandboxPool(SandboxConfig(wall_seconds=5, workers=1, audit_hook=False)) as pool:
    print(json.dumps([[r.ok, r.value, r.reason] for p in programs for r in pool.run(p, [{"a": 2}]).results]))
"""


@needs_bwrap
def test_unprivileged_user_gets_the_same_isolation():
    """Most users are not root: bubblewrap then works through a user namespace and programs keep the caller's uid;
    the kernel alone (no audit hook) must still stop forks and writes, and forged verdicts: programs then share the
    worker's uid, yet cannot reach the host's pipes through /proc (the worker is its namespace's init and not
    dumpable); records they write on their own result pipe make the run `tampered`."""
    import subprocess

    system_python = shutil.which("python3", path="/usr/bin:/bin")
    if os.geteuid() != 0 or not shutil.which("setpriv") or not system_python:
        pytest.skip("needs root (to become nobody), setpriv and a system python3")
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    probe = subprocess.run([*as_nobody, "test", "-r", str(ROOT / "src" / "instella_recipes")], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"the checkout {ROOT} is not readable by the unprivileged user nobody")
    before = tree_state(ROOT)
    out = subprocess.run(
        [*as_nobody, system_python, "-c", NOBODY_SCRIPT, str(ROOT), json.dumps(FORGERS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == [
        [True, 4, None],
        [False, None, "sandbox_denied"],
        [False, None, "sandbox_denied"],
        [False, None, "tampered"],
        [False, None, "tampered"],
        [True, 1, None],  # no host pipe could be opened
        [True, 6, None],  # and the next verdict is the program's own
    ]
    assert tree_state(ROOT) == before


@needs_bwrap
def test_a_dead_worker_is_replaced():
    with SandboxPool(SandboxConfig(workers=1, wall_seconds=5)) as pool:
        proc = pool._workers[0].proc
        proc.kill()  # the sandbox itself dies (OOM killer, a bug...)
        proc.wait()
        # bwrap's child (the worker, --die-with-parent) dies a moment later and may still answer until then: wait for
        # its end of the pipe to close, so the next run meets a dead sandbox however loaded the machine is
        assert select.select([proc.stdout], [], [], 60)[0] and proc.stdout.read() == b""
        lost = pool.run("def answer():\n    return 1\n", [{}])
        assert lost.reason == "crashed" and not lost.results[0].ok
        assert pool.run("def answer():\n    return 2\n", [{}]).results[0].value == 2


@needs_bwrap
def test_each_program_folder_is_removed_and_a_later_program_sees_nothing_of_it():
    """Issue 13.5: a program that locks its folder (chmod 000 / 0500) still has it removed after it; the next program
    on the same worker finds only its own folder under the worker's job root."""
    litter = (
        "import os\ndef answer(x):\n    os.mkdir('locked')\n    open('locked/secret.txt', 'w').write('s' * 1000)\n"
        "    open('top.txt', 'w').write('t')\n    os.chmod('locked', 0)\n    os.chmod('.', 0o500)\n    return 1\n"
    )
    look = "import os\ndef answer(x):\n    return len(os.listdir('..'))\n"
    with SandboxPool(SandboxConfig(workers=1, wall_seconds=10)) as pool:
        for _ in range(3):
            assert pool.run(litter, [{"x": 1}]).results[0].value == 1
        assert pool.run(look, [{"x": 1}]).results[0].value == 1  # its own folder, nothing else


@needs_bwrap
def test_concurrent_runs_never_share_a_program_uid():
    """Issue 24.10: program uids are leased per run (per pool), so two runs on one host at once never share one (a
    program could otherwise signal the other run's programs, and they would share one task limit)."""
    if os.geteuid() != 0:
        pytest.skip("programs get uids of their own only when the sandbox runs as root")
    whoami = "import os\ndef answer():\n    return os.getuid()\n"
    config = SandboxConfig(workers=2, wall_seconds=10)
    with SandboxPool(config) as a, SandboxPool(config) as b, SandboxPool(config, one_shot=True) as c:
        pools = {"a": a, "b": b, "c": c}
        seen = {}

        def run(name):
            seen[name] = {r.results[0].value for r in pools[name].run_many([(whoami, [{}])] * 6)}

        threads = [threading.Thread(target=run, args=(name,)) for name in pools]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        for name, pool in pools.items():
            assert len(set(pool.uids)) == 2 and seen[name] and seen[name] <= set(pool.uids), (name, seen, pool.uids)
    assert set(a.uids).isdisjoint(b.uids) and set(a.uids).isdisjoint(c.uids) and set(b.uids).isdisjoint(c.uids)


HOLDER = """
import sys, time
from instella_recipes.sandbox.uids import UidLease
lease = UidLease(int(sys.argv[1]), 4, lock_dir=sys.argv[2])
print(lease.block, lease.uids[0], flush=True)
time.sleep(120)
"""


def test_a_uid_lease_is_exclusive_and_freed_when_its_holder_is_killed(tmp_path):
    import subprocess
    import sys

    from instella_recipes.sandbox.uids import UID_BLOCK, UidLease, UidsUnavailable

    base = 1_900_000_000
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(base), str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        block, first_uid = map(int, holder.stdout.readline().split())
        assert first_uid == base == block * UID_BLOCK
        mine = UidLease(base, 4, lock_dir=tmp_path)
        assert mine.block == block + 1 and mine.uids == list(range(base + UID_BLOCK, base + UID_BLOCK + 4))
        holder.kill()  # no chance to release anything: the kernel drops its flock
        holder.wait()
        again = UidLease(base, 4, lock_dir=tmp_path)
        assert again.block == block
        again.release()
        mine.release()
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)  # anyone could swap its lock files under a holder
    with pytest.raises(UidsUnavailable, match="no one else can write to"):
        UidLease(base, 4, lock_dir=loose)


def test_the_verdict_counts_only_a_whole_run_in_the_harness_own_records():
    """The worker's side of the verdict, record by record: one record per call in the harness's shapes, a fatal
    record last, nothing else; exit status 0. Anything else fails every call of the run."""
    from instella_recipes.sandbox.worker import _reply, parse_records

    end0, end1, end2 = (b'{"end": %d}\n' % i for i in range(3))
    ok0, ok1 = (b'{"ok": true, "value": 2}\n' + end for end in (end0, end1))
    bad1 = b'{"ok": false, "reason": "exception", "detail": "E"}\n' + end1
    fatal = b'{"fatal_reason": "syntax_error", "detail": "x"}\n'
    violation = b'{"violation": "forbidden_file", "detail": "open /etc/hostname"}\n'
    records = [{"ok": True, "value": 2}, {"ok": False, "reason": "exception", "detail": "E"}]
    assert parse_records(ok0 + bad1, 2) == (records, None)
    assert parse_records(ok0 + fatal, 2)[1] == {"fatal_reason": "syntax_error", "detail": "x"}
    ok, ok2 = ok0, b'{"ok": true, "value": 2}\n' + end2
    for forged in (
        ok0 + ok1 + ok2,  # a record too many
        fatal + ok0,  # a record after the fatal one
        ok0[:-1],  # a partial line
        b'{"ok": true, "value": 2}\n',  # a call record without the harness's end-of-call marker
        ok0 + b'{"ok": true, "value": 2}\n',
        ok0 + ok0,  # the marker of another call
        end0 + ok0,  # a marker with no call
        violation + ok0,  # a record after the violation
        b'{"ok": true, "value": NaN}\n',
        b'{"ok": true, "value": true}\n',
        b'{"ok": true, "value": 2, "note": 1}\n',
        b'{"ok": "yes", "value": 2}\n',
        b"[1]\n",
        b"\n" + ok,
    ):
        assert parse_records(forged, 2) is None, forged
    request = {"id": 7, "calls": [{}, {}]}
    whole = _reply(request, ok0 + ok1, b"", 0, None)
    assert whole["reason"] is None and [r["value"] for r in whole["results"]] == [2, 2]
    for results, status, killed, reason in (
        (ok0 + ok1 + ok2, 0, None, "tampered"),
        (ok0 + ok1, 0, "timeout", "timeout"),  # records written before a kill are not believed
        (ok0 + ok1, 1 << 8, None, "crashed"),  # exit status 1
        (ok0 + ok1, 9, None, "cpu_limit"),  # SIGKILL (RLIMIT_CPU's hard limit)
        (ok0 + fatal, 0, None, "syntax_error"),
        (ok0, 0, None, "crashed"),  # a call without its record
        (b'{"ok": true, "value": 2}\n', 0, None, "tampered"),  # the forgery: one record, then exit 0
        # the verdicts from outside the program: seccomp's SIGSYS, the audit hook's exit status (86)
        (ok0 + ok1, 31, None, "forbidden_syscall"),
        (ok0 + violation, 86 << 8, None, "forbidden_file"),
        (ok0 + ok1, 86 << 8, None, "tampered"),  # the hook's record was kept off the pipe
        (ok0 + violation, 0, None, "tampered"),  # a violation record without the hook's exit
    ):
        reply = _reply(request, results, b"", status, killed)
        assert reply["reason"] == reason and [r["ok"] for r in reply["results"]] == [False, False], reply


# Issue 32's forgery: try a forbidden file and a socket, catch whatever the hook raises, write one well-formed
# record on the result pipe and leave with exit status 0. The second writes the harness's end-of-call marker too
# (nothing in the program's process is secret), the third first rebinds what a hook written naively would call.
HIDE = "    try:\n        {}\n    except BaseException:\n        pass\n"
FORGED_VERDICTS = {
    "record_and_exit": b'{"ok": true, "value": 777}\n',
    "record_marker_and_exit": b'{"ok": true, "value": 777}\n{"end": 0}\n',
}
HIDDEN_VIOLATION = (
    "import os\ndef answer():\n"
    + HIDE.format("open('/etc/hostname').read()")
    + HIDE.format("import socket; socket.socket()")
    + "    os.write(3, {record!r})\n    os._exit(0)\n"
)
REBIND = (
    "import builtins, json, os, posixpath\n"
    "builtins.any = lambda *a: True\nposixpath.abspath = os.path.abspath = lambda p: '/tmp'\n"
    "json.dumps = lambda *a, **k: '{}'\n"
)


@pytest.mark.parametrize("mode", ["bwrap", "rlimits-only"])
@pytest.mark.parametrize("audit_hook", [True, False], ids=["hook", "kernel-only"])
def test_a_program_that_tried_a_forbidden_action_cannot_forge_its_verdict(mode, audit_hook):
    """The verdict about a forbidden action comes from outside the program's process: with the hook, the hook ends
    the process at the first violation (exit status 86 and its record), before the program could catch anything;
    without it, the kernel's seccomp filter kills the process at `socket()` (SIGSYS, seen by the worker). A call
    record without the harness's end-of-call marker is tampering. None of them may come back `ok`."""
    if mode == "bwrap" and BWRAP_PROBLEM is not None:
        pytest.skip(str(BWRAP_PROBLEM))
    programs = {name: HIDDEN_VIOLATION.format(record=record) for name, record in FORGED_VERDICTS.items()}
    programs["rebind_then_forge"] = REBIND + programs["record_marker_and_exit"]
    with SandboxPool(SandboxConfig(mode=mode, audit_hook=audit_hook, workers=1, wall_seconds=10)) as pool:
        reports = {name: pool.run(source, [{}]) for name, source in programs.items()}
        assert pool.run("def answer():\n    return 5\n", [{}]).results[0].value == 5  # honest runs still pass
    if mode == "rlimits-only" and not audit_hook:
        # No hook and no isolation (the mode says so): the host's file is readable and, as root, the socket module
        # is not (the program's uid cannot read the interpreter's folder), so nothing forbidden happened; a record
        # without its end-of-call marker is still tampering.
        reports = {"record_and_exit": reports["record_and_exit"]}
    for name, report in reports.items():
        result = report.results[0]
        assert not result.ok and report.reason == result.reason, f"{name}: {report}"
        if audit_hook:
            assert result.reason == "forbidden_file", f"{name}: {report}"
        elif mode == "bwrap":  # /etc is not there (ENOENT): the socket is what the kernel stops
            expected = "tampered" if name == "record_and_exit" else "forbidden_syscall"
            assert result.reason in {expected, "forbidden_syscall"}, f"{name}: {report}"
        else:
            assert result.reason in {"tampered", "forbidden_syscall"}, f"{name}: {report}"
