"""A pytest plugin that writes each test's wall and CPU seconds to a file as the test ends (so a run stopped by a
timeout keeps what it measured): `pytest -p tests.helpers.timing ...` with INSTELLA_TEST_TIMES=<file>.

One tab-separated line per test: node id, wall s (setup + call + teardown), CPU s of this process and of the child
processes it waited for (os.times), outcome. CPU over wall says whether a test keeps the cores busy: a test of a
single-threaded process near 1, one waiting on a scheduler or a sleep near 0. `python -m tests.helpers.timing FILE`
sums the file per test module, slowest first."""

import os
import sys
import time

import pytest


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get("INSTELLA_TEST_TIMES")
    wall, cpu = time.monotonic(), _cpu()
    outcome = yield
    if path:
        reports = getattr(item, "_instella_outcomes", [])
        status = "failed" if "failed" in reports else "skipped" if "skipped" in reports else "passed"
        with open(path, "a") as handle:
            handle.write(f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t{_cpu() - cpu:.2f}\t{status}\n")
    return outcome


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    item.__dict__.setdefault("_instella_outcomes", []).append(outcome.get_result().outcome)


def summary(path: str) -> str:
    """Per test module: wall s, CPU s, CPU/wall, tests; slowest first, with the total."""
    modules: dict[str, list[float]] = {}
    for line in open(path):
        nodeid, wall, cpu, _ = line.rstrip("\n").split("\t")
        row = modules.setdefault(nodeid.split("::")[0], [0.0, 0.0, 0])
        row[0], row[1], row[2] = row[0] + float(wall), row[1] + float(cpu), row[2] + 1
    lines = [f"{'wall s':>8} {'cpu s':>8} {'cpu/wall':>8} {'tests':>5}  module"]
    for name, (wall, cpu, n) in sorted(modules.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{wall:8.1f} {cpu:8.1f} {cpu / max(wall, 1e-9):8.2f} {n:5d}  {name}")
    wall, cpu = sum(r[0] for r in modules.values()), sum(r[1] for r in modules.values())
    lines.append(f"{wall:8.1f} {cpu:8.1f} {cpu / max(wall, 1e-9):8.2f} {sum(r[2] for r in modules.values()):5d}  all")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
