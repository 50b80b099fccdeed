"""Trainer callbacks for long pretraining runs: pre-emption and non-finite steps.

- `PreemptionCallback`: SIGTERM / SIGUSR1 (what Slurm sends before a job's time limit or on pre-emption, see
  `--signal=USR1@120` in scripts/slurm/launch.sbatch) sets a flag; at the end of the current optimizer step every
  process agrees (an all-reduce of the flag), the Trainer saves a checkpoint and stops; the entry point exits 0.
- `NonFiniteCallback`: `PretrainTrainer` skips the optimizer update of a step whose gradient norm (or loss) is
  not finite and counts it; this callback logs the count, refuses periodic checkpoints while a streak is running, and
  after `max_consecutive` bad steps in a row saves a checkpoint (its weights are from before the divergence, since
  no update was applied) and stops the run, which the entry point reports as an error (exit code 3).
"""

import signal
import socket

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from instella_recipes.core import get_logger
from instella_recipes.training.stop_requests import STOP_SIGNALS, stop_requested

logger = get_logger(__name__)


def _any_rank(flag: bool) -> bool:
    if dist.is_available() and dist.is_initialized():
        backend = dist.get_backend()
        device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        t = torch.tensor([int(flag)], device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
    return flag


class PreemptionCallback(TrainerCallback):
    """Save a checkpoint and stop cleanly when SIGTERM or SIGUSR1 arrives.

    `install()` (the entry point calls it first, `restore()` last) catches the signals for the whole run, not only
    the training loop: one arriving during start-up makes the run stop before it writes anything, one arriving
    during the final save lets the save finish; either way the process exits 0 in a consistent state. A request
    that arrived before, while the entry point was still importing (`stop_requests.catch_stop_requests`), counts."""

    def __init__(self, signals=STOP_SIGNALS):
        self.requested = False
        self.preempted = False
        self.received = None  # the signal this process got (each rank says so: it reached every node)
        self.signals = signals
        self._previous = {}
        self._owned = False  # installed by the entry point: it restores the handlers, not on_train_end

    def _handler(self, signum, frame):
        self.requested = True
        self.received = self.received or signum

    def install(self) -> None:
        self._owned = True
        self._install()

    def _install(self) -> None:
        if not self._previous:
            self._previous = {sig: signal.signal(sig, self._handler) for sig in self.signals}
            self.requested = self.requested or stop_requested()  # after the swap: no request falls between

    def restore(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def on_train_begin(self, args, state, control, **kwargs):
        self._install()

    def on_step_end(self, args, state, control, **kwargs):
        if _any_rank(self.requested):
            if self.received:
                logger.warning(
                    f"rank {args.process_index} on {socket.gethostname()}: {signal.Signals(self.received).name} "
                    f"received; every rank saves checkpoint-{state.global_step} and stops"
                )
            self.preempted = True
            control.should_save = True
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if not self._owned:
            self.restore()


class NonFiniteCallback(TrainerCallback):
    """Stop after `max_consecutive` skipped (non-finite) steps in a row; keep checkpoints from before them."""

    def __init__(self, trainer, max_consecutive: int):
        self.trainer = trainer
        self.max_consecutive = max_consecutive
        self.diverged_at: int | None = None
        self.start_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start_step = state.global_step  # after a resume: the checkpoint's step

    def all_skipped(self) -> bool:
        """This session ran steps and skipped every one of them (nothing was trained: a failure, not a result)."""
        ran = self.trainer.state.global_step - self.start_step
        return ran > 0 and self.trainer.skipped_steps >= ran

    def on_step_end(self, args, state, control, **kwargs):
        streak = self.trainer.nonfinite_streak
        if streak:
            control.should_save = False  # no periodic checkpoints while a streak runs
            if streak >= self.max_consecutive:
                # No update was applied during the streak: the weights and optimizer state saved now are those from
                # before the divergence (the data position is past the bad batches).
                self.diverged_at = state.global_step - streak + 1
                control.should_save = True
                control.should_training_stop = True
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and "loss" in logs:
            logs["skipped_steps"] = self.trainer.skipped_steps
