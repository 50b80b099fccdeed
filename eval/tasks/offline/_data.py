"""Data source of the offline tasks: shipped jsonl files, found relative to the task YAML, not the cwd.

lm-eval passes `dataset_kwargs.data_files` straight to `datasets.load_dataset("json", ...)`, which resolves relative
paths against the current working directory, so a suite would only run from the repository root. The offline task
YAMLs instead name this function as their `custom_dataset`; lm-eval calls it with the task's `metadata` (which holds
`config_source`, the path of the YAML being built) and `dataset_kwargs`, and we resolve `data_files` against that
YAML's folder. Everything else about the task (prompt, choices, metrics, filters) is the upstream task's own logic.
"""

from pathlib import Path

import datasets

HERE = Path(__file__).resolve().parent


def resolve_data_files(data_files: dict[str, str], config_source: str | None = None) -> dict[str, str]:
    """Absolute paths for a `{split: path}` mapping; relative paths are taken from the YAML's folder."""
    base = Path(config_source).resolve().parent if config_source and Path(config_source).is_file() else HERE
    resolved = {}
    for split, name in data_files.items():
        path = Path(name) if Path(name).is_absolute() else base / name
        if not path.is_file():
            raise FileNotFoundError(f"offline eval data for split {split!r} not found: {path} (from {config_source})")
        resolved[split] = str(path)
    return resolved


def load(data_files: dict[str, str], config_source: str | None = None, **_ignored) -> datasets.DatasetDict:
    """`custom_dataset` hook: the jsonl files as a DatasetDict keyed by split."""
    return datasets.load_dataset("json", data_files=resolve_data_files(data_files, config_source))
