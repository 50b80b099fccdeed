"""Trainer callbacks every training stage installs (pretraining, SFT, DPO).

`PreemptionCallback`: SIGTERM / SIGUSR1 (what Slurm sends before a job's time limit or on pre-emption, see
`--signal=USR1@120` in scripts/slurm/launch.sbatch) sets a flag; at the end of the current optimizer step every
process agrees (an all-reduce of the flag), the Trainer saves a checkpoint and stops; the entry point exits 0.
(Pretraining's `NonFiniteCallback` lives beside `PretrainTrainer`, whose skip counters it reads.)
"""

import signal
import socket

import torch
import torch.distributed as dist
from transformers import TrainerCallback

from instella_recipes.core import get_logger
from instella_recipes.trainer.stop_requests import STOP_SIGNALS, stop_requested

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
    that arrived before, while the entry point was still importing (`stop_requests.catch_stop_requests`), counts.

    Why not transformers' `TrainingArguments(enable_jit_checkpoint=True)` (read in transformers 5.23,
    `trainer_jit_checkpoint.py`): it catches SIGTERM only (Slurm's `--signal=USR1@120` sends SIGUSR1), from Trainer
    construction on (a signal during imports or data loading kills the run), and each rank acts on its own signal
    after a 3 s timer thread, so ranks that get it at different steps enter the checkpoint's collectives at different
    steps and can hang; it may save in `on_pre_optimizer_step` (a step's gradients computed, not applied). Here every
    rank agrees through one all-reduce at the same step end, and the save is the Trainer's ordinary one."""

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
