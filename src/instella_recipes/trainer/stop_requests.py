"""Stop requests (SIGTERM, SIGUSR1) caught from the first line of a training entry point.

Importing torch, transformers and TRL takes seconds; a SIGTERM in that time (a scheduler's, the pipeline runner's, a
user's) would end the process with -15 before any of our code could run. Run as programs, `scripts/pretrain.py`,
`scripts/sft.py` and `scripts/dpo.py` call `catch_stop_requests()` before those imports: a request is recorded
instead, `PreemptionCallback` takes it over when the entry point installs it, and the run stops at its next phase
boundary with exit 0 and nothing written. Only the interpreter's own start, before the script's first line (tens of
milliseconds), is left to the default action.

Standard library only: importing this module must cost nothing.
"""

import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
_received: list[int] = []


def _record(signum, frame) -> None:
    _received.append(signum)


def catch_stop_requests() -> None:
    """Record SIGTERM and SIGUSR1 from now on instead of dying of them (main thread; entry points only)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _record)


def stop_requested() -> bool:
    """A stop request arrived since `catch_stop_requests()`."""
    return bool(_received)
