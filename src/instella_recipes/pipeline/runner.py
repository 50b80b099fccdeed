"""Run a checked `Pipeline`: each stage as a subprocess, its output teed to `<output_dir>/logs/<stage>.log`, a progress
line on the console, a run record in `<output_dir>/pipeline/<stage>.json` (command, identity, wall time).

A stage is *complete* when its output folder holds `manifest.json` (written last by the entry point, so a stage that
died half-way never looks complete) and the run record says the pipeline ran it to the end with the same identity
(its resolved command line, the digest of its recipe and of its inputs' manifests) and saw this very manifest.
Complete stages are skipped; a stage whose recipe, arguments or inputs changed is run again from an empty folder;
one that was interrupted with the same identity keeps its folder so that an entry point can resume from it. `plan`
says beforehand which stages a run will run and why (`--dry_run`), dependents of re-run stages included.

Stage processes never outlive the runner: each starts in its own session (process group), which the runner stops
(SIGTERM, then SIGKILL after a grace period) when it is interrupted (SIGINT, SIGTERM, SIGHUP) or fails, and the
kernel sends it SIGTERM when the runner itself dies (PR_SET_PDEATHSIG, for SIGKILL of the runner), while a tiny
watchdog process stops the rest of its group then (the processes the stage started). Either way the stage gets the
path of a direct SIGTERM: the training saves a checkpoint and exits 0. The watchdog also holds the stage's output
pipe and copies what the stage writes into its log once the runner is gone: without a reader, the stage's next
progress line would fail with EPIPE and kill it before its checkpoint. A lock file beside
each stage folder (`<folder>.lock`, fcntl.flock, naming the holder's pid and host) keeps a second run from writing it
at the same time; the stage process inherits the lock, so it holds while that process lives.
"""

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import re
import resource
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path

from tqdm.auto import tqdm

from instella_recipes.core import (
    MANIFEST,
    RecipeError,
    atomic_write_text,
    file_digest,
    read_manifest,
    require_complete,
    retract_manifest,
    write_manifest,
)

from .graph import ROOT, Pipeline, PipelineStage


class StageFailed(RuntimeError):
    """A stage exited non-zero or finished without its manifest; the message names the stage and its log."""


class PipelineInterrupted(KeyboardInterrupt):
    """The runner got SIGTERM or SIGHUP (SIGINT stays a plain KeyboardInterrupt); the running stage was stopped."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


STOP_GRACE_S = 30.0  # seconds a stopped stage gets to save a consistent state before SIGKILL
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def read_record(stage: PipelineStage) -> dict | None:
    """The stage's run record (`stage.resolved.record`), or None before its first run."""
    path = stage.resolved.record
    return json.loads(path.read_text()) if path.is_file() else None


def _write_record(stage: PipelineStage, record: dict) -> None:
    path = stage.resolved.record
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")


def fingerprint(pipeline: Pipeline, stage: PipelineStage) -> str | None:
    """The stage's identity: command, recipe digest, resolved args, env and the digests of its inputs' manifests.
    None while an input is not complete yet."""
    inputs = {}
    for name in stage.inputs:
        source = pipeline.stage(name)
        manifest = source.resolved.output / MANIFEST
        if not manifest.is_file():
            return None
        # The input's manifest, and (when the pipeline made it) which run of it: a re-run upstream re-runs us even
        # if its manifest happens to be byte-identical.
        record = read_record(source) or {}
        inputs[name] = [file_digest(manifest), record.get("fingerprint"), record.get("run_id")]
    resolved = stage.resolved
    identity = {
        "command": stage.command,
        "accelerate_config": resolved.accelerate_config and file_digest(resolved.accelerate_config),
        "recipe": stage.recipe,
        "recipe_digest": resolved.recipe_file and file_digest(resolved.recipe_file),
        "recipe_overrides": resolved.recipe_text,
        "args": resolved.args,
        "env": resolved.env,
        "inputs": inputs,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def stage_status(pipeline: Pipeline, stage: PipelineStage) -> str:
    """'complete', 'partial' (interrupted run of this same identity: resumable), 'stale' (made by something else or
    another recipe/input), 'missing', or 'waiting' (an input is not complete)."""
    return status_for(stage, fingerprint(pipeline, stage))


def status_for(stage: PipelineStage, current: str | None) -> str:
    """`stage_status` given the stage's `fingerprint` (which hashes the recipe and every input manifest), for a
    caller that needs the fingerprint too."""
    output = stage.resolved.output
    if current is None:
        return "waiting"
    record = read_record(stage) or {}
    manifest = output / MANIFEST
    same = record.get("fingerprint") == current
    if manifest.is_file():
        done = record.get("status") == "done" and record.get("manifest_digest") == file_digest(manifest)
        return "complete" if same and done else "stale"
    if not output.exists():
        return "missing"
    return "partial" if same else "stale"


def _child_env(stage: PipelineStage) -> dict:
    env = {**os.environ, **stage.resolved.env, "PYTHONUNBUFFERED": "1"}
    # The children import `instella_recipes` / `modeling_instella` from the same checkout as this process.
    paths = (str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


_STATUS_SPLIT = re.compile(r"[\r\n]+")
_HF_LOG_PREFIX = re.compile(r"^\[(\w+)\|[^\]]*\] \S+ \S+ >> ")  # transformers' "[INFO|file.py:12] date time >> "


def status_text(line: str, width: int = 80) -> str:
    """A stage's latest output line for the progress bar: transformers' log prefix shortened to its level, and a
    long line cut in the middle (a log message keeps its start, a tqdm bar its counts and rate at the end)."""
    line = _HF_LOG_PREFIX.sub(r"[\1] ", line.strip())
    if len(line) <= width:
        return line
    head = (width - 1) // 2
    return line[:head] + "…" + line[-(width - 1 - head) :]


def _stream(proc, log, bar, verbose: bool) -> list[str]:
    """Copy the child's output to the log (and the console when verbose); show its latest line on the progress
    bar. Returns the last lines, for the failure message."""
    tail, last_update, pending = [], 0.0, ""
    fd = proc.stdout.fileno()
    while chunk := os.read(fd, 1 << 16):
        log.write(chunk)
        log.flush()
        if verbose:
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        pieces = _STATUS_SPLIT.split(pending + chunk.decode(errors="replace"))
        pending = pieces.pop()
        tail = (tail + [p for p in pieces if p.strip()])[-20:]
        latest = status_text(pending or (tail[-1] if tail else ""))
        if bar is not None and latest and time.monotonic() - last_update > 0.5:
            bar.set_postfix_str(latest, refresh=True)
            last_update = time.monotonic()
    return (tail + [pending])[-20:] if pending.strip() else tail


def _die_with_runner(runner_pid: int):
    """A `preexec_fn`: in the forked child, ask the kernel for SIGTERM when the runner dies (it may be SIGKILLed and
    get no chance to stop its stages). subprocess has no option for this; prctl is Linux-only, so elsewhere it is
    skipped (the process-group handling still covers every signal the runner can catch)."""

    def preexec() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            return
        if os.getppid() != runner_pid:  # the runner died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
        # A pre-emption request (USR1, see forward_preemption) that lands before the training has installed its
        # own handler must not kill the stage: ignored until then (an exec keeps SIG_IGN; it resets handlers).
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)

    return preexec


def _start_stage(argv: list[str], env: dict, lock_fd: int) -> subprocess.Popen:
    """The stage in its own session (so its whole process tree can be signalled), holding the stage lock."""
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        bufsize=0,
        start_new_session=True,
        pass_fds=(lock_fd,),
        preexec_fn=_die_with_runner(os.getpid()),
    )


# The watchdog: a bare Python process (no imports of ours) that waits for EOF on a pipe only the runner writes to,
# i.e. for the runner to end however it ends, then stops whatever is left of the stage's process group (SIGTERM,
# SIGKILL after the grace period) while it copies the stage's output, from its own copy of the pipe's read end, to
# the end of the log, until no writer is left (or, once the group is killed, for a few more seconds at most).
_WATCHDOG = """
import os, select, signal, sys, time
fd, pgid, grace, out, log = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
while os.read(fd, 1):
    pass
def signal_group(sig):
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
def drain(until):
    while time.monotonic() < until:
        ready, _, _ = select.select([out], [], [], min(0.2, max(0.0, until - time.monotonic())))
        chunk = os.read(out, 1 << 16) if ready else b""
        if ready and not chunk:
            return True  # every writer is gone
        if chunk:
            try:
                with open(log, "ab") as handle:
                    handle.write(chunk)
            except OSError:
                pass
        elif not signal_group(0):
            return False
    return False
if signal_group(0):
    note = "[pipeline] the runner has ended: stopping the stage's processes (SIGTERM, SIGKILL after %.0f s)" % grace
    try:
        with open(log, "ab") as handle:
            handle.write(("\\n" + note + "\\n").encode())
    except OSError:
        pass
signal_group(signal.SIGTERM)
done = drain(time.monotonic() + grace)
signal_group(signal.SIGKILL)
if not done:
    drain(time.monotonic() + 5)
"""


def _start_watchdog(pgid: int, output_fd: int, log: Path, grace: float = STOP_GRACE_S) -> int:
    """Start the watchdog for process group `pgid` (whose output pipe's read end is `output_fd`, logged to `log`);
    return the pipe's write end, which the runner keeps open while the stage runs and closes after it (the kernel
    closes it if the runner is killed)."""
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-c", _WATCHDOG, str(read_end), str(pgid), str(grace), str(output_fd), str(log)]
    subprocess.Popen(
        argv,
        pass_fds=(read_end, output_fd),
        start_new_session=True,  # a signal to the runner's group must not take the watchdog with it
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(read_end)
    return write_end


def _stop_stage(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM to the stage's process group (entry points save a consistent state on it), SIGKILL after `grace`."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # members of the group that outlived its leader
        os.killpg(proc.pid, signal.SIGKILL)


@contextlib.contextmanager
def stage_lock(stage: PipelineStage):
    """Hold `<stage folder>.lock` (fcntl.flock) while the stage runs; yield its fd (passed on to the stage process).
    A folder another run holds is a `RecipeError` naming that run's pid and host, before anything is touched. The
    file is removed when the stage is over (a finished run leaves no lock files); a lock won on a file that another
    run removed meanwhile is taken again on the new file, so two runs never hold different inodes of one path."""
    path = stage.resolved.lock
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = path.read_text().strip() if path.exists() else ""
            raise RecipeError(
                f"stage '{stage.name}': {stage.resolved.output} is being written by another run "
                f"({holder or 'an unknown process'}, lock {path}); wait for it to finish or stop it, then run again"
            ) from None
        with contextlib.suppress(FileNotFoundError):
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # the holder before us removed the file after we opened it: lock the current one
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on host {socket.gethostname()}\n".encode(), 0)
        yield fd
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # still holding the lock: a run that opened the old file sees the inode change and retries
        os.close(fd)


@contextlib.contextmanager
def forward_preemption(pgid: int):
    """While a stage runs, SIGUSR1 to the runner (Slurm's `--signal=B:USR1` through the batch shell, or a user's
    `kill -USR1`) goes on to the stage's process group: the stage runs in its own session, so a signal to the
    runner's group no longer reaches it, and the training saves a checkpoint and exits 0 on it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, previous)


@contextlib.contextmanager
def stop_on_signals():
    """While the pipeline runs, SIGTERM and SIGHUP raise `PipelineInterrupted` in the main thread (as SIGINT raises
    KeyboardInterrupt), so the running stage is stopped instead of being orphaned."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers live in the main thread
        yield
        return

    def handler(signum, _frame):
        raise PipelineInterrupted(signum)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_stage(pipeline: Pipeline, stage: PipelineStage, bar=None, verbose: bool = False, launcher=None) -> dict:
    """Run one stage whose inputs are complete; return its run record or raise `StageFailed`. `launcher(argv)`
    (the executor seam) may wrap the command, e.g. in `srun` inside a Slurm job (pipeline/slurm.py). The stage
    folder is locked for the whole run (a `RecipeError` when another run holds it)."""
    for name in stage.inputs:
        require_complete(pipeline.stage(name).resolved.output, f"stage '{stage.name}' input '{name}'")
    with stage_lock(stage) as lock_fd:
        return _run_locked(pipeline, stage, lock_fd, bar, verbose, launcher)


def _run_locked(pipeline: Pipeline, stage: PipelineStage, lock_fd: int, bar, verbose: bool, launcher) -> dict:
    resolved = stage.resolved
    current = fingerprint(pipeline, stage)  # once, under the lock: the status and the record both use it
    output, status = resolved.output, status_for(stage, current)
    if status == "stale" or (output / MANIFEST).exists():
        retract_manifest(output)  # first: a kill during the removal leaves nothing complete-looking
        shutil.rmtree(output)  # made by another recipe or input: start clean (entry points refuse foreign runs)
    # A command that writes no manifest is not a project entry point; give it its folder (e.g. for --output x.json).
    (output if not stage.writes_manifest else output.parent).mkdir(parents=True, exist_ok=True)
    if resolved.recipe_copy is not None:
        resolved.recipe_copy.parent.mkdir(parents=True, exist_ok=True)
        resolved.recipe_copy.write_text(resolved.recipe_text)
    argv = launcher(resolved.argv) if launcher is not None else resolved.argv
    log = resolved.log
    log.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "stage": stage.name,
        "group": stage.group,
        "description": stage.description,
        "command": shlex.join(argv),
        "recipe": str(resolved.recipe_copy or stage.recipe) if stage.recipe else None,
        "inputs": stage.inputs,
        "values": stage.values,
        "set": pipeline.overrides,  # the run's `--set` overrides of `vars` (the report states them)
        "output": str(output),
        "log": str(log),
        "fingerprint": current,
        "status": "running",
        "resumed": status == "partial",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "run_id": uuid.uuid4().hex,  # unique per run (two runs can start within one second of started_at)
    }
    _write_record(stage, record)
    start, cpu_start = time.monotonic(), _children_cpu()
    with open(log, "wb") as handle:
        handle.write(f"$ {shlex.join(argv)}\n".encode())
        handle.flush()
        proc = _start_stage(argv, _child_env(stage), lock_fd)
        watchdog = _start_watchdog(proc.pid, proc.stdout.fileno(), log)
        try:
            with forward_preemption(proc.pid):
                tail = _stream(proc, handle, bar, verbose)
                code = proc.wait()
        except BaseException:  # a signal or an engine error: do not leave the stage's processes running
            os.close(watchdog)  # first: the watchdog logs what the stage writes while it stops
            _stop_stage(proc)
            _write_record(stage, {**record, "status": "interrupted", "wall_s": time.monotonic() - start})
            raise
    os.close(watchdog)  # the watchdog now stops what the stage left behind in its group, if anything
    # CPU seconds of the stage's processes: unlike wall time, barely changed by other load on the machine.
    record.update(wall_s=round(time.monotonic() - start, 2), cpu_s=round(_children_cpu() - cpu_start, 2))
    record["returncode"] = code
    record["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    problem = None
    if code != 0:
        problem = f"exited with code {code}"
    elif stage.writes_manifest and not (output / MANIFEST).is_file():
        problem = f"exited 0 but wrote no {MANIFEST} in {output} (the output is incomplete)"
    if problem:
        _write_record(stage, {**record, "status": "failed"})
        last = "\n".join(f"    {line}" for line in tail[-12:])
        raise StageFailed(
            f"stage '{stage.name}' failed: {problem} after {record['wall_s']:.1f}s.\n"
            f"  log: {log}\n  command: {record['command']}\n  last lines of the log:\n{last}"
        )
    if not stage.writes_manifest:
        output.mkdir(parents=True, exist_ok=True)
        write_manifest(
            output,
            stage.name,
            command=argv,
            recipe=stage.recipe,
            inputs={n: str(pipeline.stage(n).resolved.output) for n in stage.inputs},
            written_by="scripts/pipeline.py",
        )
    record.update(status="done", manifest_digest=file_digest(output / MANIFEST))
    _write_record(stage, record)
    return record


def plan(
    pipeline: Pipeline, stages: list[PipelineStage], force: bool = False, in_flight: Iterable[str] = ()
) -> list[tuple[PipelineStage, str, str | None]]:
    """What `run_pipeline(pipeline, stages, force)` (or the Slurm executor's `submit`) will do, decided before
    anything runs: (stage, its status now, why it will run, or None when it will be skipped). A stage that is
    complete now still runs again when one of its inputs runs: the input's new run changes the stage's identity,
    which its status alone cannot show yet (a `--set` change re-runs every stage downstream of the first one it
    touches). `in_flight` names stages that already run elsewhere (queued or running Slurm jobs): they count as
    running inputs."""
    runs, steps = set(in_flight), []
    for stage in stages:
        status = stage_status(pipeline, stage)
        upstream = [name for name in stage.inputs if name in runs]
        if force:
            why = "--force"
        elif upstream:
            names = ", ".join(upstream)
            why = f"input {names} runs first" if len(upstream) == 1 else f"inputs {names} run first"
        elif status != "complete":
            why = REASONS.get(status, status)
        else:
            why = None
        if why:
            runs.add(stage.name)
        steps.append((stage, status, why))
    return steps


REASONS = {
    "missing": "no output yet",
    "partial": "resumes an interrupted run",
    "stale": "its recipe, arguments or inputs changed",
    "waiting": "an input is not complete yet",
}


def unchecked_inputs_note(pipeline: Pipeline, stage: PipelineStage) -> str | None:
    """For a stage whose command is not one of our entry points (`lm_eval`, ...): a comment line saying that the
    command itself reads its input folders without checking them against their manifests (our entry points do, and
    `run_stage` does before it starts the stage), and the command that checks them by hand; None for our scripts."""
    if stage.command.endswith(".py") or not stage.inputs:
        return None
    folders = [str(pipeline.stage(name).resolved.output) for name in stage.inputs]
    return (
        f"# note: `{Path(stage.command).name}` does not check {', '.join(folders)} against the checksums in its "
        f"{MANIFEST} (the pipeline does before it runs this stage); run by hand, check first: "
        f"python scripts/verify_data.py --folders {shlex.join(folders)}"
    )


def check_inputs(pipeline: Pipeline, stages: list[PipelineStage]) -> None:
    """Before `--stage X`: every input outside the selection must be complete, or a clear error says what to run."""
    chosen = {s.name for s in stages}
    for stage in stages:
        for name in stage.inputs:
            if name in chosen:
                continue
            source = pipeline.stage(name)
            if read_manifest(source.resolved.output) is None:
                raise RecipeError(
                    f"stage '{stage.name}' needs the output of stage '{name}' ({source.resolved.output}), which "
                    f"is not complete (no {MANIFEST}). Run it first: python scripts/pipeline.py --config "
                    f"{pipeline.path} --output_dir {pipeline.output_dir} --stage {source.group}"
                )


def run_pipeline(
    pipeline: Pipeline, only: list[PipelineStage] | None = None, force: bool = False, verbose: bool = False
) -> list[dict]:
    """Run `only` (default: every stage) in order, skipping complete ones unless `force`. Returns one summary row
    per stage: name, 'ran' or 'skipped', wall seconds (of the run that made the output)."""
    stages = only or pipeline.stages
    if only:
        check_inputs(pipeline, stages)
    summary = []
    bar_format = "{desc}: {bar:12} {n_fmt}/{total_fmt} stages [{elapsed}]{postfix}"
    bar = None if verbose else tqdm(total=len(stages), dynamic_ncols=True, file=sys.stderr, bar_format=bar_format)
    say = print if verbose else tqdm.write
    try:
        _run_stages(pipeline, stages, force, bar, say, summary)
    finally:
        if bar is not None:
            bar.close()
    return summary


def _run_stages(pipeline: Pipeline, stages: list[PipelineStage], force: bool, bar, say, summary: list) -> None:
    verbose = bar is None
    with stop_on_signals():
        for index, stage in enumerate(stages, 1):
            if bar is not None:
                bar.set_description_str(f"{stage.name}")
                bar.set_postfix_str("", refresh=True)
            status = stage_status(pipeline, stage)
            if status == "complete" and not force:
                record = read_record(stage) or {}
                say(f"[{index}/{len(stages)}] {stage.name}: complete, skipped ({stage.resolved.output})")
                summary.append({"stage": stage.name, "action": "skipped", "wall_s": record.get("wall_s")})
            else:
                say(f"[{index}/{len(stages)}] {stage.name}: running (log: {stage.resolved.log})")
                record = run_stage(pipeline, stage, bar, verbose)
                say(f"[{index}/{len(stages)}] {stage.name}: done in {record['wall_s']:.1f}s")
                summary.append({"stage": stage.name, "action": "ran", "wall_s": record["wall_s"]})
            if bar is not None:
                bar.update(1)
