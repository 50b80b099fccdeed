"""The end-to-end half of tests/unit/sandbox/test_sandbox.py
(processes, whole runs, oracles); the in-process tests are there.

The sandbox is a security boundary: every escape attempt is contained (the host and the project tree are
unchanged, checked here) and reported under the right reason, and no program can forge its own verdict or another's.
Each attempt runs twice: with the audit hook that names the violation, and without it, to prove the kernel's
isolation holds on its own. Program uids are leased per run: tests look only at their own pool's."""

import os
import socket
import threading
from pathlib import Path

import pytest

from instella_recipes.sandbox import SandboxConfig, SandboxPool
from tests.unit.sandbox import test_sandbox as unit_half  # fixtures and helpers both halves use

FORGE, FORGED_RECORD, FORGED_REPLY, FORGERS, FORGE_FDS, FORGE_HOST, FORGE_PROC, ROOT, needs_bwrap, tree_state = (
    unit_half.FORGE,
    unit_half.FORGED_RECORD,
    unit_half.FORGED_REPLY,
    unit_half.FORGERS,
    unit_half.FORGE_FDS,
    unit_half.FORGE_HOST,
    unit_half.FORGE_PROC,
    unit_half.ROOT,
    unit_half.needs_bwrap,
    unit_half.tree_state,
)


LIMITS = dict(wall_seconds=3.0, cpu_seconds=10, memory_mb=512, workers=2)


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
        "forge_then_exit": (  # its record lacks the harness's end-of-call marker
            FORGERS + "def answer(x):\n    forge_fds()\n    os._exit(1)\n",
            {"tampered"},
            {"tampered"},
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
            {"forbidden_syscall"},  # the kernel's seccomp filter kills it at socket()
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
