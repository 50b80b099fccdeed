"""What a healthy run shows: ranges a run's report checks it against, so a user can tell whether their run is right.

The ranges are data (`eval/expected/<pipeline>.yaml`, named by the report stage's `--expect`), set from recorded
runs (the demo's: docs/demo_report.md), wide enough for another machine or seed and narrow enough that a broken
stage falls outside. Each check reads what the stages left (the same readers as the report) and is one of:

    checks:
      - name: stage 1 learns the corpus
        loss: {stage: stage1, first: [5.5, 7.5], last: [0.3, 1.5]}  # every run of a stage or matrix group
      - name: DPO prefers the chosen answers
        log: {stage: dpo, key: rewards/margins, last: [0.1, null]}    # any `log_history` key; null = open end
      - name: SFT raises facts accuracy
        score: {model: sft, task: tiny_world_facts_chat, metric: acc, range: [0.6, 1.0], above: merge, by: 0.2}
      - name: greedy speculative decoding keeps the target's output
        speculative: {mode: greedy, identical: all, acceptance: [0.2, 1.0]}

`score` names the evaluated model's stage (an evaluation stage's first input), `above`/`by`: the score must exceed
that model's by at least `by`. A check whose stage did not run is reported as not checked, not as a failure.
"""

from pathlib import Path

import yaml

from instella_recipes.core import RecipeError
from instella_recipes.core.paths import REPO_ROOT
from instella_recipes.evaluation.results import loss_history, read_eval_results, speculative_results

KINDS = {
    "loss": {"stage", "first", "last"},
    "log": {"stage", "key", "first", "last"},
    "score": {"model", "task", "metric", "range", "above", "by"},
    "speculative": {"mode", "identical", "acceptance"},
}


def load_expectations(path: str | Path) -> list[dict]:
    """The checks of an expectations file; a malformed entry is a `RecipeError` naming the file and entry."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"expectations file {path} does not exist")
    checks = (yaml.safe_load(path.read_text()) or {}).get("checks")
    if not isinstance(checks, list) or not checks:
        raise RecipeError(f"{path}: expected a `checks:` list (see instella_recipes/pipeline/health.py)")
    for i, check in enumerate(checks):
        kinds = [k for k in KINDS if k in (check or {})]
        if len(kinds) != 1 or not check.get("name") or set(check) - {"name", kinds[0]}:
            raise RecipeError(f"{path}: checks[{i}]: give a `name` and one of {sorted(KINDS)}")
        body = check[kinds[0]]
        if not isinstance(body, dict) or set(body) - KINDS[kinds[0]]:
            raise RecipeError(f"{path}: checks[{i}].{kinds[0]}: keys are {sorted(KINDS[kinds[0]])}")
        for key in ("first", "last", "range", "acceptance"):
            if key in body and not _is_range(body[key]):
                raise RecipeError(f"{path}: checks[{i}].{kinds[0]}.{key}: a range is [low, high] (null: open end)")
    return checks


def _is_range(value) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(v is None or isinstance(v, int | float) for v in value)


def _inside(value: float, bounds: list) -> bool:
    low, high = bounds
    return (low is None or value >= low) and (high is None or value <= high)


def _show(bounds: list) -> str:
    low, high = bounds
    if high is None:
        return f">= {low:g}"
    return f"<= {high:g}" if low is None else f"{low:g} to {high:g}"


def _check_history(body: dict, records: list[dict], key: str) -> list[tuple[str, str, bool | None]]:
    """(expected, observed, ok) for each run of the stage (a matrix group: each seed)."""
    runs = [r for r in records if body["stage"] in (r["stage"], r.get("group"))]
    out = []
    for r in runs:
        history = loss_history(r["output"], key)
        if not history:
            continue
        for end, value in (("first", history[0][1]), ("last", history[-1][1])):
            if end in body:
                out.append(
                    (f"{r['stage']} {key} {end}: {_show(body[end])}", f"{value:.3f}", _inside(value, body[end]))
                )
    return out


def _scores(records: list[dict]) -> dict[str, dict[tuple[str, str], float]]:
    """Scores by evaluated model stage (an evaluation stage's first input), as the report's table keys them."""
    out = {}
    for r in records:
        output = Path(r["output"])
        if output.is_dir() and any(output.rglob("results*.json")):
            model = (r.get("inputs") or [r["stage"]])[0]
            out[model] = {(row["task"], row["metric"]): row["value"] for row in read_eval_results([output])}
    return out


def _check_score(body: dict, records: list[dict]) -> list[tuple[str, str, bool | None]]:
    scores = _scores(records)
    key = (body["task"], body["metric"])
    value = scores.get(body["model"], {}).get(key)
    if value is None:
        return []
    out = []
    if "range" in body:
        out.append((f"{body['model']} {body['task']} {body['metric']}: {_show(body['range'])}", f"{value:.3f}",
                    _inside(value, body["range"])))  # fmt: skip
    base = scores.get(body.get("above"), {}).get(key)
    if base is not None:
        gain = body.get("by", 0.0)
        out.append((f"{body['model']} minus {body['above']}: >= {gain:g}", f"{value:.3f} - {base:.3f} = "
                    f"{value - base:+.3f}", value - base >= gain))  # fmt: skip
    return out


def _check_speculative(body: dict, records: list[dict]) -> list[tuple[str, str, bool | None]]:
    out = []
    for r in records:
        for s in speculative_results(r["output"]):
            if s.get("mode") != body.get("mode", s.get("mode")):
                continue
            if body.get("identical") == "all":
                same, total = s.get("identical_outputs"), s.get("prompts")
                out.append((f"{s['mode']} outputs identical: all", f"{same}/{total}", same == total))
            if "acceptance" in body and isinstance(s.get("acceptance_rate"), int | float):
                rate = s["acceptance_rate"]
                out.append((f"{s['mode']} acceptance: {_show(body['acceptance'])}", f"{rate:.3f}",
                            _inside(rate, body["acceptance"])))  # fmt: skip
    return out


def evaluate(check: dict, records: list[dict]) -> list[tuple[str, str, bool | None]]:
    """(expected, observed, ok) rows of one check; no rows when its stage did not run."""
    if "loss" in check:
        return _check_history(check["loss"], records, "loss")
    if "log" in check:
        return _check_history(check["log"], records, check["log"]["key"])
    if "score" in check:
        return _check_score(check["score"], records)
    return _check_speculative(check["speculative"], records)


def health_section(records: list[dict], path: str | Path) -> list[str]:
    """The report's "what a healthy run shows" table: every check against this run, ok or OUTSIDE."""
    checks = load_expectations(path)
    shown = Path(path).resolve()
    shown = shown.relative_to(REPO_ROOT) if shown.is_relative_to(REPO_ROOT) else shown  # the clone's own file
    lines = [
        "## What a healthy run shows",
        "",
        f"Ranges from `{shown}` (set from recorded runs; wide enough for another machine or seed, narrow enough that "
        "a broken stage falls outside). OUTSIDE marks a result to look into; 'not run' a check whose stage is absent.",
        "",
        "| check | expected | this run | |",
        "|---|---|---|---|",
    ]
    outside = 0
    for check in checks:
        rows = evaluate(check, records)
        if not rows:
            lines.append(f"| {check['name']} | | not run | |")
        for expected, observed, ok in rows:
            outside += ok is False
            lines.append(f"| {check['name']} | {expected} | {observed} | {'ok' if ok else '**OUTSIDE**'} |")
    verdict = "every result is inside its range" if not outside else f"{outside} result(s) OUTSIDE their range"
    return lines + ["", f"Verdict: {verdict}.", ""]
