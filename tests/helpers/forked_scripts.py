"""Run many entry-point scripts as `python scripts/<name>.py ARGS` would, for the start-up cost of one process:

    python tests/helpers/forked_scripts.py OUT.json ARGS_JSON SCRIPT...

This process imports the heavy third-party packages once (torch, transformers, datasets, accelerate, peft, TRL: about
3 CPU s, most of what `--help` of each script costs), then forks one child per script, which runs the script as
`__main__` (`runpy.run_path`, `sys.argv` and `sys.path[0]` as the interpreter sets them for a script) with its own
stdout and stderr. Each script imports the project's modules itself, in a process of its own: only the third-party
modules are shared. OUT.json: {script: {"returncode", "stdout", "stderr"}}. Used by test_entry_points_help.py.
"""

import importlib
import json
import os
import runpy
import signal
import sys
import tempfile
import traceback

HEAVY = ("torch", "transformers", "datasets", "accelerate", "peft", "trl")


def _child(script: str, args: list[str]) -> int:
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as for `python scripts/<name>.py`
    try:
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as exc:  # the interpreter's rules for `raise SystemExit(code)`
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


def run(script: str, args: list[str]) -> dict:
    """`python script *args` in a forked child: its return code, stdout and stderr."""
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        signal.alarm(300)  # a child that hangs (a lock held across the fork) ends with SIGALRM, named by its code
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        code = 1
        try:
            code = _child(script, args)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    texts = []
    for handle in (out, err):
        handle.seek(0)
        texts.append(handle.read().decode(errors="replace"))
    return {"returncode": os.waitstatus_to_exitcode(status), "stdout": texts[0], "stderr": texts[1]}


def main() -> None:
    out, args, scripts = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
    for name in HEAVY:
        importlib.import_module(name)
    results = {script: run(script, args) for script in scripts}
    with open(out, "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main()
