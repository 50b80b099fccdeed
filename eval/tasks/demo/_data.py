"""`custom_dataset` hook of the demo's own lm-eval task: the shipped TinyWorld eval items (`eval/data/tiny_world/`),
found relative to this file rather than the working directory."""

from pathlib import Path

import datasets

DATA = Path(__file__).resolve().parents[2] / "data" / "tiny_world"


def load(data_files: dict[str, str], **_ignored) -> datasets.DatasetDict:
    return datasets.load_dataset("json", data_files={split: str(DATA / name) for split, name in data_files.items()})
