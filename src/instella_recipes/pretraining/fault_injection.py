"""Fault-injection plugins (the `plugins:` hook of scripts/pretrain.py) used to prove fault tolerance.

    plugins: [instella_recipes.pretraining.fault_injection:nan_loss]     plugin_args: {nan_steps: [3, 5, 6, 7]}
    plugins: [instella_recipes.pretraining.fault_injection:kill_at_step] plugin_args: {kill_step: 5, kill_signal: KILL}

`nan_loss` turns the loss of the listed optimizer steps (1-based) into NaN through a forward hook (the contract's
way to touch the loss); `kill_at_step` sends a signal to its own process (rank `rank`, default 0) at the end of a step
(SIGKILL: a crash; SIGSTOP: a hung rank, the others wait in their next collective; SIGTERM/SIGUSR1: a pre-emption;
SLURM: Slurm's own USR1 to the job's batch shell), or with `kill_target: parent` to the process that started it (the
pipeline runner, SIGKILLed under a running stage).
"""

import os
import signal
import subprocess
import time

from transformers import TrainerCallback


class _StepTracker(TrainerCallback):
    def __init__(self):
        self.step = 0

    def on_step_begin(self, args, state, control, **kwargs):
        self.step = state.global_step + 1


def nan_loss(model, plugin_args: dict) -> list:
    tracker = _StepTracker()
    bad = {int(s) for s in plugin_args.get("nan_steps", [])}

    def hook(module, inputs, outputs):
        if module.training and tracker.step in bad and getattr(outputs, "loss", None) is not None:
            outputs.loss = outputs.loss * float("nan")
        return outputs

    model.register_forward_hook(hook)
    return [tracker]


class _Killer(TrainerCallback):
    def __init__(self, step: int, sig: signal.Signals, once_file: str | None, rank: int = 0, target: str = "self"):
        self.step, self.sig, self.once_file, self.rank, self.target = step, sig, once_file, rank, target
        self.fired_before = False

    def on_train_begin(self, args, state, control, **kwargs):
        # fire in the first run only, so the resumed run (same recipe) goes through
        self.fired_before = bool(self.once_file) and os.path.exists(self.once_file)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step != self.step or self.fired_before:
            return
        if int(os.environ.get("RANK", "0")) != self.rank:
            if self.sig == "SLURM":  # the other ranks hold the step too until the batch shell's relay reached them
                _await_signal(lambda: None)
            return
        if self.once_file:  # a test that acts on the fault (e.g. takes the node away) waits for this file
            if os.path.exists(self.once_file):
                return
            open(self.once_file, "w").close()
        if self.sig == "SLURM":  # a real Slurm pre-emption: Slurm signals the job's batch shell, as at the time limit
            _await_signal(lambda: subprocess.run(["scancel", "--batch", "--signal=USR1", os.environ["SLURM_JOB_ID"]],
                                                 check=True))  # fmt: skip
            return
        if self.target == "parent":  # the parent's death reaches this stage as a SIGTERM (PR_SET_PDEATHSIG, the
            # pipeline's watchdog) only once the dying parent is scheduled: hold the step until it has arrived
            _await_signal(lambda: os.kill(os.getppid(), self.sig), signal.SIGTERM)
            return
        os.kill(os.getpid(), self.sig)


def _await_signal(request, sig: signal.Signals = signal.SIGUSR1, timeout: float = 60.0) -> None:
    """Call `request` (which makes someone else send this process `sig`) and hold this step until the signal has
    arrived and the run's own handler has seen it: delivery through slurmctld and the batch shell is asynchronous,
    and a tiny run would otherwise finish before it lands, so the test would not test pre-emption at all."""
    arrived = False
    previous = signal.getsignal(sig)

    def chained(signum, frame):
        nonlocal arrived
        arrived = True
        if callable(previous):
            previous(signum, frame)

    signal.signal(sig, chained)
    try:
        request()
        deadline = time.monotonic() + timeout
        while not arrived and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        signal.signal(sig, previous)


class _SignalAtTrainEnd(TrainerCallback):
    def __init__(self, sig: signal.Signals):
        self.sig = sig

    def on_train_end(self, args, state, control, **kwargs):
        os.kill(os.getpid(), self.sig)


def signal_at_phase(model, plugin_args: dict) -> list:
    """`plugin_args: {phase: start|end, signal: TERM}`: the signal arrives during start-up (now, while the plugins
    are loaded, before any output is written) or as training ends (before the final save)."""
    sig = getattr(signal, "SIG" + str(plugin_args.get("signal", "TERM")).upper())
    if plugin_args.get("phase", "start") == "start":
        os.kill(os.getpid(), sig)
        return []
    return [_SignalAtTrainEnd(sig)]


def kill_at_step(model, plugin_args: dict) -> list:
    """`plugin_args: {kill_step: N, kill_signal: KILL|STOP|TERM|USR1|SLURM, rank: R (default 0), once_file: path
    (optional), kill_target: self|parent (optional)}`; SLURM: ask Slurm to send USR1 to this job's batch shell
    (`--signal=B:USR1` delivery, in a job)."""
    name = str(plugin_args.get("kill_signal", "KILL")).upper()
    sig = name if name == "SLURM" else getattr(signal, "SIG" + name)
    rank = int(plugin_args.get("rank", 0))
    target = str(plugin_args.get("kill_target", "self"))
    if target not in ("self", "parent"):
        raise ValueError(f"kill_target must be self or parent, not {target!r}")
    return [_Killer(int(plugin_args["kill_step"]), sig, plugin_args.get("once_file"), rank, target)]
