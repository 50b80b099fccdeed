"""The bubblewrap sandbox that runs untrusted programs (synthetic GSM8K's generated programs, HumanEval completions):
a pool of warm sandboxed workers (`pool`), the process inside each sandbox (`worker`, standard library only) and
the unprivileged uids leased per run (`uids`). Standard library only: importing it costs nothing.
`python -m instella_recipes.sandbox` checks that the sandbox works on this machine."""

from .pool import (
    MODES,
    ProgramResult,
    RunReport,
    SandboxConfig,
    SandboxPool,
    SandboxUnavailable,
    check_sandbox,
    program_hash,
    unbounded_loop,
)

__all__ = [
    "MODES",
    "ProgramResult",
    "RunReport",
    "SandboxConfig",
    "SandboxPool",
    "SandboxUnavailable",
    "check_sandbox",
    "program_hash",
    "unbounded_loop",
]
