"""Readers for what the stages leave behind: lm-eval result JSONs, Trainer `log_history`, speculative-decoding
summaries. Used by the model card (`scripts/release.py`) and the demo report (`scripts/pipeline_report.py`)."""

import json
from pathlib import Path

from instella_recipes.core import RecipeError


def eval_result_files(paths: list[str | Path]) -> list[Path]:
    """lm-eval writes `<output_path>/<model>/results_<time>.json`: files are taken as given; a folder gives the
    newest result file of each folder under it (a re-run with the same output_path adds a newer file and leaves the
    older, stale one beside it). The one finder for the report, the model card and the demo report."""
    files = []
    for path in map(Path, paths):
        if path.is_dir():
            newest = {}
            for file in sorted(path.rglob("results*.json"), key=lambda f: f.stat().st_mtime):
                newest[file.parent] = file
            files += sorted(newest.values())
        elif path.is_file():
            files.append(path)
        else:
            raise RecipeError(f"eval results: {path} does not exist")
    return files


def load_result_json(file: str | Path) -> dict:
    """One lm-eval result file as a JSON object; a file cut short (a killed run, a full disk) or not JSON is a
    `RecipeError` naming it."""
    try:
        data = json.loads(Path(file).read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise RecipeError(
            f"{file}: not a readable lm-eval result file ({err}; cut short by a killed run or a full disk?): run "
            f"that evaluation again"
        ) from None
    if not isinstance(data, dict):
        raise RecipeError(f"{file}: not an lm-eval result file (a JSON {type(data).__name__}, not an object)")
    return data


def read_eval_results(paths: list[str | Path]) -> list[dict]:
    """Rows `{task, metric, value, stderr, n_shot, n}` from lm-eval result JSONs (files, or folders searched for
    `results*.json`); a metric reported under a filter other than `none` is named `metric (filter)`; `n` is the
    number of items the score is over (lm-eval's `n-samples` `effective`: after `--limit`), None if not recorded.
    Group rows without scores and bookkeeping numbers (`sample_len`) are left out."""
    rows = []
    for file in eval_result_files(paths):
        data = load_result_json(file)
        n_shot = data.get("n-shot", {})
        counts = data.get("n-samples", {})
        for task, metrics in sorted(data.get("results", {}).items()):
            for key, value in metrics.items():
                name, _, filt = key.partition(",")
                stderr_key = f"{name}_stderr,{filt}"
                # a score has a stderr entry beside it (lm-eval writes one, "N/A" if unknown); `sample_len` has none
                if name.endswith("_stderr") or stderr_key not in metrics or not isinstance(value, int | float):
                    continue
                stderr = metrics[stderr_key]
                rows.append(
                    {
                        "task": task,
                        "metric": name if filt in ("", "none") else f"{name} ({filt})",
                        "value": float(value),
                        "stderr": stderr if isinstance(stderr, int | float) else None,
                        "n_shot": n_shot.get(task),
                        "n": _item_count(counts.get(task)),
                    }
                )
    return rows


def _item_count(count) -> int | None:
    if not isinstance(count, dict):
        return None
    value = count.get("effective", count.get("original"))
    return int(value) if isinstance(value, int | float) else None


def trainer_state(folder: str | Path) -> dict | None:
    """The Trainer's `trainer_state.json` of a training output (top level, else its newest checkpoint)."""
    folder = Path(folder)
    top = folder / "trainer_state.json"
    if top.is_file():
        return json.loads(top.read_text())
    checkpoints = sorted(
        folder.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1])
    )
    return json.loads(checkpoints[-1].read_text()) if checkpoints else None


def loss_history(folder: str | Path, key: str = "loss") -> list[tuple[int, float]]:
    """(step, value) of every `log_history` entry that logged `key` (the training loss by default)."""
    state = trainer_state(folder) or {}
    return [(int(e["step"]), float(e[key])) for e in state.get("log_history", []) if key in e and "step" in e]


def speculative_results(folder: str | Path) -> list[dict]:
    """The summaries `scripts/speculative.py --output` writes (one per decoding mode): `speculative*.json`."""
    rows = []
    for file in sorted(Path(folder).glob("speculative*.json")):
        data = json.loads(file.read_text())
        rows += [row for row in (data if isinstance(data, list) else [data]) if isinstance(row, dict)]
    return rows
