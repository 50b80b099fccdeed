"""Checkpoints that are complete or absent: written aside, then renamed; and `resume_from_checkpoint: auto`.

The Trainer writes `checkpoint-<step>` piece by piece (model, optimizer, scheduler, RNG, trainer_state). A kill in
the middle would leave a folder that `get_last_checkpoint` takes for a good one. `PretrainTrainer` therefore saves
into `<output_dir>/.staging/checkpoint-<step>` and renames it into place once every process has finished writing;
`find_resume_checkpoint` only ever sees complete folders (and also requires `trainer_state.json`, which the
Trainer writes last).
"""

import os
import re
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

STAGING = ".staging"
_CHECKPOINT = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoint folders of a run, oldest step first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _CHECKPOINT.match(child.name)
        if match and child.is_dir() and (child / "trainer_state.json").is_file():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def find_resume_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete checkpoint under `output_dir`, or None (start from scratch)."""
    found = complete_checkpoints(output_dir)
    return str(found[-1]) if found else None


def resolve_resume(value: str | bool | None, output_dir: str | Path) -> str | None:
    """`auto`/`true`: newest complete checkpoint or None; a path: that path; None/`false`: no resume."""
    if value in (None, False, "", "false", "False", "none", "None"):
        return None
    if value in (True, "auto", "true", "True", "latest"):
        return find_resume_checkpoint(output_dir)
    return str(value)


def publish(staged: Path, final: Path) -> None:
    """Move a fully written checkpoint into place (atomic rename on one filesystem)."""
    if final.exists():  # the same step saved again (e.g. pre-emption right after a periodic save)
        old = final.with_name(final.name + ".old")
        os.replace(final, old)
        os.replace(staged, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(staged, final)
