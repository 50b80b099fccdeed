"""Output-folder manifests: what made a stage's output, written last so that its presence means "complete".

Every entry point writes `manifest.json` into its output folder as its final act (after the model, tokenizer and
logs are in place), through a temporary file and a rename. The next stage checks its input's manifest, and
`scripts/pipeline.py` skips a stage whose manifest matches the recipe it would run.
"""

import dataclasses
import hashlib
import json
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .errors import RecipeError
from .io import atomic_write_text

MANIFEST = "manifest.json"
_PACKAGES = ("torch", "transformers", "accelerate", "trl", "datasets", "peft", "lm_eval")


def file_digest(path: str | Path) -> str:
    """sha256 of a file's bytes (recipes, data files, tokenizers)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def write_manifest(output_dir: str | Path, stage: str, **fields) -> Path:
    """Atomically write `output_dir/manifest.json` with the stage name, `fields` (recipe, inputs, seed, ...),
    the library versions and the time. Call it last."""
    output_dir = Path(output_dir)
    record = {"stage": stage, **fields, "versions": _versions(), "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
    return atomic_write_text(output_dir / MANIFEST, json.dumps(record, indent=2, default=str) + "\n")


def resolved_arguments(**groups) -> dict[str, dict]:
    """The arguments a run used (recipe defaults + command-line overrides), one JSON-able dict per group, for the
    manifest's `arguments` field; `TrainingArguments` go through their own `to_dict` (which hides tokens)."""
    out = {}
    for name, args in groups.items():
        data = args.to_dict() if hasattr(args, "to_dict") else dataclasses.asdict(args)
        out[name] = json.loads(json.dumps(data, default=str))
    return out


def read_manifest(output_dir: str | Path) -> dict | None:
    path = Path(output_dir) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else None


def require_complete(input_dir: str | Path, what: str = "input") -> dict:
    """The manifest of a finished stage output, or a `RecipeError` saying which stage to (re)run."""
    manifest = read_manifest(input_dir)
    if manifest is None:
        raise RecipeError(
            f"{what} {input_dir} is not a finished stage output (no {MANIFEST}): run the stage that makes it first, "
            f"or point to a complete folder"
        )
    return manifest
