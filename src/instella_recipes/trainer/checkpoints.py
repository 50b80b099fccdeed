"""Checkpoints that are complete or absent: written aside, then renamed; and `resume_from_checkpoint: auto`.

The Trainer writes `checkpoint-<step>` piece by piece (model, optimizer, scheduler, RNG, trainer_state). A kill in
the middle would leave a folder that `get_last_checkpoint` takes for a good one. `PretrainTrainer`
(`pretraining/pretrain_trainer.py`) therefore saves into `<output_dir>/.staging/checkpoint-<step>` and renames it into
place once every process has finished writing; `find_resume_checkpoint` only ever sees complete folders (and also
requires `trainer_state.json`, which the Trainer writes last; SFT and DPO resume through it too).
"""

import os
import re
import shutil
from pathlib import Path

from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from instella_recipes.core import RecipeError, get_logger
from instella_recipes.weights.safetensors_io import check_readable

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


def damage(checkpoint: Path) -> str | None:
    """Why a complete-looking checkpoint cannot be resumed from (an unreadable safetensors file), or None."""
    try:
        check_readable(checkpoint)
    except RecipeError as err:
        return str(err)
    return None


def find_resume_checkpoint(output_dir: str | Path) -> str | None:
    """The newest complete, readable checkpoint under `output_dir`, or None (start from scratch). A damaged newer one
    is passed over with a warning naming it; when every checkpoint is damaged, a `RecipeError`."""
    found = complete_checkpoints(output_dir)
    damaged = []
    for checkpoint in reversed(found):
        problem = damage(checkpoint)
        if problem is None:
            if damaged:
                get_logger(__name__).warning(
                    f"{damaged[0][0].name} is damaged ({damaged[0][1]}); resuming from the previous complete "
                    f"checkpoint {checkpoint.name}"
                )
            return str(checkpoint)
        damaged.append((checkpoint, problem))
    if damaged:
        raise RecipeError(
            f"every checkpoint in {output_dir} is damaged (newest: {damaged[0][1]}): delete them to start over, or "
            f"restore one from a copy"
        )
    return None


def resolve_resume(value: str | bool | None, output_dir: str | Path) -> str | None:
    """The one resume rule of every stage (`resume_from_checkpoint`): `auto`/`true` (the default): the newest complete
    checkpoint in output_dir, or None (a fresh start) when there is none; a path: that checkpoint, which must exist;
    `none`/`false`/unset: None."""
    if value in (None, False, "", "false", "False", "none", "None", "null"):
        return None
    if value in (True, "auto", "true", "True", "latest"):
        return find_resume_checkpoint(output_dir)
    if not Path(value).is_dir():
        raise RecipeError(
            f"resume_from_checkpoint {value} does not exist: give a checkpoint folder, auto (the newest in "
            f"output_dir, if any) or none"
        )
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
