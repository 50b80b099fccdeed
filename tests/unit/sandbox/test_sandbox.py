"""The sandbox is a security boundary: every escape attempt is contained (the host and the project tree are
unchanged, checked here) and reported under the right reason, and no program can forge its own verdict or another's.
Each attempt runs twice: with the audit hook that names the violation, and without it, to prove the kernel's
isolation holds on its own. Program uids are leased per run: tests look only at their own pool's."""

import json
import os
import shutil
import socket
import threading
from pathlib import Path

import pytest

from instella_recipes.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable, check_sandbox, unbounded_loop
from tests.synthetic_fakes import BWRAP_PROBLEM

ROOT = Path(__file__).resolve().parents[1]
needs_bwrap = pytest.mark.skipif(BWRAP_PROBLEM is not None, reason=str(BWRAP_PROBLEM))
LIMITS = dict(wall_seconds=3.0, cpu_seconds=10, memory_mb=512, workers=2)


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


def sandbox_uid_processes(uids: list[int]) -> list[int]:
    """Host processes running as one of a pool's program uids (there must be none after a run)."""
    uids = set(uids)
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid in uids:
                    found.append(int(entry))
            except FileNotFoundError:
                pass
    return found


@pytest.fixture
def listener():
    """A TCP listener on 127.0.0.1 that records every connection it receives."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    received, stop = [], threading.Event()

    def accept():
        while not stop.is_set():
            try:
                received.append(server.accept())
            except (TimeoutError, OSError):
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1], received
    stop.set()
    thread.join()
    server.close()


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


def attacks(secret: Path, port: int) -> dict[str, tuple[str, set[str], set[str]]]:
    """name -> (program, reason with the audit hook, reasons allowed from the kernel alone). A program that runs to
    its end returns 1 (so an `ok` with any other value is a forged or leaked verdict)."""
    pwned = ROOT / "PWNED"
    return {
        # Forged verdicts: records the harness did not write make the run `tampered`; records written before the
        # run failed (timeout, exit) are not believed; the host's pipes are out of reach (1 + 1000 x opened).
        "forge_everything": (
            FORGERS + "def answer(x):\n    forge_fds()\n    forge_proc()\n    return 1 + 1000 * forge_host()\n",
            {"tampered"},
            {"tampered"},
        ),
        "forge_fds": (FORGERS + "def answer(x):\n    forge_fds()\n    return 1\n", {"tampered"}, {"tampered"}),
        "forge_proc_fd": (
            FORGERS + "def answer(x):\n    forge_proc()\n    return 1\n",
            {"tampered", "forbidden_file"},  # the hook stops the reopen, after the write on the listed fd
            {"tampered"},
        ),
        "forge_host_pipes": (
            FORGERS + "def answer(x):\n    return 1 + 1000 * forge_host()\n",
            {"forbidden_file"},
            {None},  # nothing to open: it returns its own 1
        ),
        "forge_then_hang": (
            FORGERS + "def answer(x):\n    forge_fds()\n    while x >= 0:\n        x += 1\n",
            {"timeout"},
            {"timeout"},
        ),
        "forge_then_exit": (
            FORGERS + "def answer(x):\n    forge_fds()\n    os._exit(1)\n",
            {"crashed"},
            {"crashed"},
        ),
        "loop_forever": ("def answer(x):\n    while x >= 0:\n        x += 1\n", {"timeout"}, {"timeout"}),
        "fork_bomb": (
            "import os\ndef answer(x):\n    while 1:\n        os.fork()\n",
            {"forbidden_process"},
            {"sandbox_denied"},
        ),
        "allocate_20gb": ("def answer(x):\n    b = bytearray(20 * 2**30)\n    return 1\n", {"memory"}, {"memory"}),
        "write_project": (
            f"def answer(x):\n    open({str(pwned)!r}, 'w').write('x')\n    return 1\n",
            {"forbidden_file"},
            {"sandbox_denied"},
        ),
        "read_outside": (
            f"def answer(x):\n    return len(open({str(secret)!r}).read())\n",
            {"forbidden_file"},
            {"sandbox_denied"},
        ),
        "socket_to_host": (
            f"import socket\ndef answer(x):\n    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'leak')\n    return 1\n",
            {"forbidden_network"},
            {"sandbox_denied"},
        ),
        "os_system": (
            f"import os\ndef answer(x):\n    os.system('touch {pwned}')\n    return 1\n",
            {"forbidden_process"},
            {None},  # fork fails inside system(); the program goes on, the file is never made
        ),
        "subprocess_run": (
            f"import subprocess\ndef answer(x):\n    subprocess.run(['touch', {str(pwned)!r}])\n    return 1\n",
            {"forbidden_process"},
            {"sandbox_denied"},
        ),
        "print_100mb": (  # 100 x 1 MB lines: 100 MB in total
            "def answer(x):\n    for _ in range(100):\n        print('x' * 1_000_000)\n    return 1\n",
            {"output_limit"},
            {"output_limit"},
        ),
    }


@needs_bwrap
@pytest.mark.parametrize("audit_hook", [True, False], ids=["hook", "kernel-only"])
def test_escape_attempts_are_contained_and_named(tmp_path, listener, audit_hook):
    port, received = listener
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    programs = attacks(secret, port)
    before = tree_state(ROOT)
    config = SandboxConfig(audit_hook=audit_hook, **LIMITS)
    with SandboxPool(config) as pool:
        reports = dict(zip(programs, pool.run_many([(src, [{"x": 1}]) for src, _, _ in programs.values()])))
        # the pool keeps serving after all that, with true verdicts (no forged reply was waiting in a pipe)
        for x in range(2 * config.workers):
            assert pool.run("def answer(x):\n    return x * 2\n", [{"x": x}]).results[0].value == 2 * x
        uids = pool.uids
    for name, (_, hooked, kernel) in programs.items():
        result = reports[name].results[0]
        expected = hooked if audit_hook else kernel
        reason = result.reason if not result.ok else None
        assert reason in expected, f"{name}: {result}"
        assert not result.ok or result.value == 1, f"{name}: a forged or leaked result {result}"
    assert tree_state(ROOT) == before, "the project tree changed"
    assert not (ROOT / "PWNED").exists()
    assert received == [], "a sandboxed program reached the host's 127.0.0.1"
    assert secret.read_text() == "host secret"
    assert sandbox_uid_processes(uids) == [], "processes survived the sandbox"


@needs_bwrap
def test_cpu_limit_and_results():
    with SandboxPool(SandboxConfig(wall_seconds=20, cpu_seconds=1, workers=1)) as pool:
        spin = pool.run("def answer(x):\n    while x >= 0:\n        x += 1\n", [{"x": 0}])
        assert spin.reason == "cpu_limit"
        report = pool.run(
            "def answer(a, b):\n    if b == 0:\n        return 1 / b\n    return math.sqrt(a) / b\n",
            [{"a": 16, "b": 2}, {"a": 1, "b": 0}, {"a": 9, "b": 3}],
        )
        assert [(r.ok, r.value, r.reason) for r in report.results] == [
            (True, 2.0, None),
            (False, None, "exception"),
            (True, 1.0, None),
        ]
        odd = pool.run("def answer():\n    return 'seven'\n", [{}])
        assert odd.results[0].reason == "non_numeric"
        broken = pool.run("def answer(:\n", [{}])
        assert broken.reason == "syntax_error"
        missing = pool.run("x = 1\n", [{}])
        assert missing.reason == "no_answer_function"
        exits = pool.run("import os\ndef answer():\n    os._exit(0)\n", [{}])
        assert exits.results[0].reason == "crashed"
        values = pool.run(
            "import fractions\ndef answer(k):\n"
            "    return [10**400, 10**20, fractions.Fraction(6, 2), float('nan'), None][k]\n",
            [{"k": k} for k in range(5)],
        )
        assert [(r.value, r.reason) for r in values.results] == [
            (None, "non_numeric"),
            (1e20, None),
            (3, None),
            (None, "non_numeric"),
            (None, "non_numeric"),
        ]
        native = pool.run("import ctypes\ndef answer():\n    return ctypes.CDLL(None).getpid()\n", [{}])
        assert native.reason == "forbidden_native" or native.results[0].reason == "forbidden_native"


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
        pool._workers[0].proc.kill()  # the sandbox itself dies (OOM killer, a bug...)
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

    ok, bad = b'{"ok": true, "value": 2}\n', b'{"ok": false, "reason": "exception", "detail": "E"}\n'
    fatal = b'{"fatal_reason": "syntax_error", "detail": "x"}\n'
    records = [{"ok": True, "value": 2}, {"ok": False, "reason": "exception", "detail": "E"}]
    assert parse_records(ok + bad, 2) == (records, None)
    assert parse_records(ok + fatal, 2)[1] == {"fatal_reason": "syntax_error", "detail": "x"}
    for forged in (
        ok + ok + ok,  # a record too many
        fatal + ok,  # a record after the fatal one
        ok[:-1],  # a partial line
        b'{"ok": true, "value": NaN}\n',
        b'{"ok": true, "value": true}\n',
        b'{"ok": true, "value": 2, "note": 1}\n',
        b'{"ok": "yes", "value": 2}\n',
        b"[1]\n",
        b"\n" + ok,
    ):
        assert parse_records(forged, 2) is None, forged
    request = {"id": 7, "calls": [{}, {}]}
    whole = _reply(request, ok + ok, b"", 0, None)
    assert whole["reason"] is None and [r["value"] for r in whole["results"]] == [2, 2]
    for results, status, killed, reason in (
        (ok + ok + ok, 0, None, "tampered"),
        (ok + ok, 0, "timeout", "timeout"),  # records written before a kill are not believed
        (ok + ok, 1 << 8, None, "crashed"),  # exit status 1
        (ok + ok, 9, None, "cpu_limit"),  # SIGKILL (RLIMIT_CPU's hard limit)
        (ok + fatal, 0, None, "syntax_error"),
        (ok, 0, None, "crashed"),  # a call without its record
    ):
        reply = _reply(request, results, b"", status, killed)
        assert reply["reason"] == reason and [r["ok"] for r in reply["results"]] == [False, False], reply
