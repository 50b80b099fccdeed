"""The report of a pipeline run, from what its stages left behind: the pipeline's run records
(`<run_dir>/pipeline/*.json`: command, wall time), each training output's `trainer_state.json` (`log_history`),
lm-eval result JSONs in the evaluation outputs, and the speculative-decoding summaries.

Sections: wall time per stage, loss curves (one chart per stage; the seeds of a matrix stage such as stage 2 share a
chart), evaluation scores per evaluated stage side by side, speculative decoding. Plots are drawn with matplotlib's
Agg backend (no display needed). Entry point: `scripts/pipeline_report.py` (`main` here):

    python scripts/pipeline_report.py --run_dir runs/demo --expect eval/expected/tiny_demo.yaml
    # -> runs/demo/report.md + PNG plots in runs/demo/report/; the run checked against a healthy run's ranges
"""

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

from instella_recipes.core import (  # noqa: E402
    RecipeError,
    atomic_write_text,
    check_output_dir,
    complete_stage,
    exit_on_recipe_error,
    parse_recipe,
    retract_manifest,
    setup_logging,
    write_manifest,
)
from instella_recipes.evaluation.results import loss_history, read_eval_results, speculative_results, trainer_state
from instella_recipes.pipeline.health import health_section  # noqa: E402

LOSS_LABELS = {"dpo": "DPO loss (sigmoid, length-normalised)", "sft": "cross-entropy on assistant tokens"}


def read_records(run_dir: Path) -> list[dict]:
    """The pipeline's run records, in the order the stages ran."""
    folder = run_dir / "pipeline"
    if not folder.is_dir():
        raise RecipeError(f"{run_dir} has no pipeline/ run records: run scripts/pipeline.py --output_dir {run_dir}")
    # `<stage>.slurm.json` beside them holds the Slurm executor's job ids, not a run record
    records = [json.loads(p.read_text()) for p in folder.glob("*.json") if not p.name.endswith(".slurm.json")]
    records = [r for r in records if r.get("status") != "running"]  # e.g. this report stage itself
    return sorted(records, key=lambda r: (r.get("started_at", ""), r["stage"]))


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.1f} s" if seconds < 90 else f"{seconds / 60:.1f} min ({seconds:.0f} s)"


def _style(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title, fontsize=12)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)


# --- sections ------------------------------------------------------------------------------------------------------
def overrides_section(records: list[dict]) -> list[str]:
    """The `--set` overrides of `vars` each stage ran with (its run record's `set`), grouped: a stage skipped as
    complete keeps the settings of the run that made it."""
    groups: dict[str, list[str]] = {}
    for r in records:
        key = json.dumps(r["set"], sort_keys=True) if isinstance(r.get("set"), dict) else "null"
        groups.setdefault(key, []).append(r["stage"])
    if list(groups) == ["{}"]:
        return ["Every stage ran with the pipeline YAML's `vars` as written (no `--set` overrides).", ""]
    lines = ["## Overrides (`--set`)", "", "| `--set` | stages that ran with it |", "|---|---|"]
    for key, stages in groups.items():
        values = json.loads(key)
        if values is None:
            text = "not recorded (a run record older than this report's format)"
        else:
            text = " ".join(f"`{k}={v}`" for k, v in values.items()) or "none (the YAML's `vars`)"
        lines.append(f"| {text} | {', '.join(stages)} |")
    return lines + [""]


def wall_time_section(records: list[dict], plots: Path, link: Path) -> list[str]:
    lines = ["## Wall time per stage", ""]
    lines += ["| stage | what | wall time | CPU time | status |", "|---|---|---|---|---|"]
    for r in records:
        cpu = f"{r['cpu_s']:.0f} s" if r.get("cpu_s") is not None else "-"
        what = r.get("description") or "-"
        lines.append(f"| {r['stage']} | {what} | {_minutes(r.get('wall_s'))} | {cpu} | {r['status']} |")
    total = sum(r.get("wall_s") or 0 for r in records)
    cpu_total = sum(r.get("cpu_s") or 0 for r in records)
    lines += [f"| **total** | | **{_minutes(total)}** | {cpu_total:.0f} s | |", ""]
    lines += [
        "CPU time is the stages' processes' user + system seconds (all threads): it changes little when other work "
        "shares the machine, while wall time does.",
        "",
    ]
    timed = [r for r in records if r.get("wall_s") is not None]
    if timed:
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(timed) + 1.5))
        bars = ax.barh([r["stage"] for r in timed][::-1], [r["wall_s"] for r in timed][::-1], color="#4c72b0")
        ax.bar_label(bars, fmt="%.0f s", fontsize=8, padding=2)
        _style(ax, f"Wall time per stage (total {total / 60:.1f} min)", "seconds", "stage")
        fig.tight_layout()
        fig.savefig(plots / "wall_time.png", dpi=110)
        plt.close(fig)
        lines += [f"![wall time per stage]({link}/wall_time.png)", ""]
    return lines


def loss_section(records: list[dict], plots: Path, link: Path) -> list[str]:
    groups: dict[str, list[tuple[str, list, str]]] = {}
    for r in records:
        history = loss_history(r["output"])
        if history:
            label = ", ".join(f"{k} {v}" for k, v in (r.get("values") or {}).items()) or r["stage"]
            groups.setdefault(r.get("group") or r["stage"], []).append((label, history, r["output"]))
    if not groups:
        return ["## Loss curves", "", "No stage logged a training loss (no trainer_state.json found).", ""]
    lines = ["## Loss curves", "", "| stage | run | steps | first loss | last loss |", "|---|---|---|---|---|"]
    for group, runs in groups.items():
        for label, history, folder in runs:
            # the run's optimizer steps (its last logged step is earlier when logging_steps does not divide them)
            steps = (trainer_state(folder) or {}).get("global_step") or history[-1][0]
            lines.append(f"| {group} | {label} | {steps} | {history[0][1]:.3f} | {history[-1][1]:.3f} |")
    lines.append("")
    for group, runs in groups.items():
        margins = {label: loss_history(folder, "rewards/margins") for label, _, folder in runs}
        panels = 2 if any(margins.values()) else 1  # DPO: also the reward margin (chosen minus rejected)
        fig, axes = plt.subplots(1, panels, figsize=(7 * panels, 4.2), squeeze=False)
        ax = axes[0][0]
        for label, history, _ in runs:
            steps, values = zip(*history)
            ax.plot(steps, values, label=label, linewidth=1.6, marker="." if len(steps) < 40 else None)
        title = f"{group}: training loss" + (f" ({len(runs)} seeds)" if len(runs) > 1 else "")
        _style(ax, title, "optimizer step", LOSS_LABELS.get(group, "loss (mean token cross-entropy)"))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=9)
        if panels == 2:
            ax = axes[0][1]
            for label, history in margins.items():
                if history:
                    steps, values = zip(*history)
                    ax.plot(steps, values, label=label, linewidth=1.6, marker=".", color="#c44e52")
            _style(ax, f"{group}: reward margin", "optimizer step", "reward(chosen) - reward(rejected)")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.legend(fontsize=9)
        fig.tight_layout()
        fig.savefig(plots / f"loss_{group}.png", dpi=110)
        plt.close(fig)
        lines += [f"![{group} loss]({link}/loss_{group}.png)", ""]
    return lines


def _score_cell(row: dict | None) -> str:
    if row is None:
        return "-"
    return f"{row['value']:.3f}" + (f" ± {row['stderr']:.3f}" if row.get("stderr") is not None else "")


def _items_cell(rows: list[dict | None]) -> str:
    """The item count of a task, once when every checkpoint saw the same number (else one per checkpoint)."""
    counts = [row["n"] if row and row.get("n") is not None else "?" for row in rows if row]
    return str(counts[0]) if len(set(counts)) == 1 else " / ".join(map(str, counts))


EVAL_NOTE = (
    "Each score is the mean over the task's items, ± lm-eval's standard error of that mean (`items`: how many, "
    "after `--limit`). With n items one item moves a score by 1/n (24 items: 0.042), so checkpoints whose scores "
    "differ by less than about two standard errors are not told apart by this suite."
)


# lm-eval metrics for which lower is better (the chart marks them; every other score is higher-is-better)
LOWER_IS_BETTER = ("bits_per_byte", "perplexity")


def lower_is_better(metric: str) -> bool:
    return any(name in metric for name in LOWER_IS_BETTER)


def chart_bars(scores: dict[str, dict], keys: list) -> dict[str, list[int]]:
    """Per checkpoint, the positions (indices into `keys`) it has a score for: a stage that was not evaluated on a
    task gets no bar there (a 0.00 bar would read as a measured zero)."""
    return {model: [k for k, key in enumerate(keys) if key in by_key] for model, by_key in scores.items()}


def chart_label(task: str, metric: str) -> str:
    """A task's tick label: task, metric on its own line, and the direction where lower is better."""
    label = f"{task}\n{metric.replace(' (', chr(10) + '(')}"
    return label + ("\n(lower is better)" if lower_is_better(metric) else "")


def eval_section(records: list[dict], plots: Path, link: Path) -> list[str]:
    rows: dict[str, dict[tuple[str, str], dict]] = {}
    for r in records:
        output = Path(r["output"])
        if not output.is_dir() or not any(output.rglob("results*.json")):
            continue
        model = (r.get("inputs") or [r["stage"]])[0]  # an evaluation stage's first input is the model it scored
        rows[model] = {(row["task"], row["metric"]): row for row in read_eval_results([output])}
    if not rows:
        return ["## Evaluation", "", "No lm-eval results found.", ""]
    scores = {m: {k: row["value"] for k, row in by_key.items()} for m, by_key in rows.items()}
    models = list(scores)
    keys = sorted({k for s in scores.values() for k in s})
    lines = ["## Evaluation (lm-eval, offline suites)", "", EVAL_NOTE, ""]
    lines += ["| task | metric | items | " + " | ".join(models) + " |", "|---|---|---|" + "---|" * len(models)]
    for key in keys:
        cells = [rows[m].get(key) for m in models]
        lines.append(f"| {key[0]} | {key[1]} | {_items_cell(cells)} | " + " | ".join(map(_score_cell, cells)) + " |")
    lines.append("")
    fig, ax = plt.subplots(figsize=(max(7, 1.8 * len(keys) + 2), 4.8))
    width = 0.8 / len(models)
    for i, (model, present) in enumerate(chart_bars(scores, keys).items()):
        xs = [k + (i - (len(models) - 1) / 2) * width for k in present]
        # error bars: lm-eval's standard error of each mean (the table's ±), clipped to the [0, 1] score range
        values = [scores[model][keys[k]] for k in present]
        errors = [(rows[model].get(keys[k]) or {}).get("stderr") or 0.0 for k in present]
        low = [min(e, v) for v, e in zip(values, errors)]
        high = [max(0.0, min(e, 1.0 - v)) for v, e in zip(values, errors)]  # bits per byte can exceed 1
        bars = ax.bar(xs, values, width, label=model, yerr=[low, high], capsize=3, error_kw={"elinewidth": 1})
        ax.bar_label(bars, fmt="%.2f", fontsize=8, padding=2)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([chart_label(t, m) for t, m in keys], fontsize=8)
    ax.set_ylim(0, max(1.05, *(1.1 * v for s in scores.values() for v in s.values())))
    title = "Evaluation scores per stage (bars: ± one standard error; no bar: not evaluated on that task)"
    _style(ax, title, "task / metric", "score (higher is better unless marked)")
    ax.legend(title="checkpoint", fontsize=9)
    fig.tight_layout()
    fig.savefig(plots / "eval_scores.png", dpi=110)
    plt.close(fig)
    return lines + [f"![evaluation scores per stage]({link}/eval_scores.png)", ""]


def speculative_section(records: list[dict]) -> list[str]:
    rows = [(r, row) for r in records for row in speculative_results(r["output"])] if records else []
    if not rows:
        return []
    lines = [
        "## Speculative decoding (target + draft, transformers assisted generation)",
        "",
        "| stage | mode | acceptance | drafted | accepted | tok/s target | tok/s target+draft | speedup | identical |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r, s in rows:

        def num(key, fmt=".3f", s=s):
            value = s.get(key)
            return format(value, fmt) if isinstance(value, int | float) else "-"

        lines.append(
            f"| {r['stage']} | {s.get('mode', '-')} | {num('acceptance_rate')} | {s.get('drafted_tokens', '-')} | "
            f"{s.get('accepted_tokens', '-')} | {num('tokens_per_s_base', '.1f')} | "
            f"{num('tokens_per_s_assisted', '.1f')} | {num('speedup', '.2f')}x | "
            f"{s.get('identical_outputs', '-')}/{s.get('prompts', '-')} |"
        )
    skipped = {s.get("prompts_skipped_too_long") for _, s in rows} - {None, 0}
    if skipped:
        context = next(s.get("context_tokens") for _, s in rows if s.get("prompts_skipped_too_long"))
        lines += ["", f"Prompts: the first that fit the models' {context}-token context with the new tokens; "
                  f"{max(skipped)} longer one(s) were passed over (a model run past its trained positions decodes "
                  "noise)."]  # fmt: skip
    if any(isinstance(s.get("speedup"), int | float) and s["speedup"] < 1 for _, s in rows):
        lines += [
            "",
            "A speedup below 1 means assisted generation was slower here: with models this small a forward pass "
            "costs little more than the per-step overhead, so drafting saves nothing on a CPU; the acceptance rate "
            "(how often the target agrees with the draft) is the number that carries over to real model sizes.",
        ]
    return lines + [""]


def machine() -> str:
    """The machine in words, for the report's header: CPU model and cores (and the GPU when there is one)."""
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ", no GPU"
    return f"{cpu}, {os.cpu_count()} cores{gpu}"


def grpo_section(records: list[dict], plots: Path, link: Path) -> list[str]:
    """Stages that logged a GRPO `reward` per step: reward, pass@1 and pass@n (0/1 rewards) per step, and a chart."""
    lines = []
    for r in records:
        history = loss_history(r["output"], "reward")
        if not history:
            continue
        state = trainer_state(r["output"]) or {}
        entries = [e for e in state.get("log_history", []) if "reward" in e]
        pass_n = next((k for k in (entries[0] if entries else {}) if k.startswith("pass@") and k != "pass@1"), None)
        lines += [
            f"## GRPO: {r['stage']}",
            "",
            f"| step | reward | pass@1 | {pass_n or 'pass@n'} |",
            "|---|---|---|---|",
        ]
        for e in entries:
            cells = [f"{e[k]:.3f}" if k in e else "-" for k in ("reward", "pass@1", pass_n)]
            lines.append(f"| {e['step']} | " + " | ".join(cells) + " |")
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for key in ("reward", "pass@1", pass_n):
            curve = loss_history(r["output"], key) if key else []
            if curve and (key == "reward" or curve != history):
                ax.plot(*zip(*curve), label=key, linewidth=1.6, marker=".")
        _style(ax, f"{r['stage']}: reward on its training prompts", "optimizer step", "mean over the samples")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=9)
        fig.tight_layout()
        fig.savefig(plots / f"grpo_{r['stage']}.png", dpi=110)
        plt.close(fig)
        lines += ["", f"![{r['stage']} reward]({link}/grpo_{r['stage']}.png)", ""]
    return lines


def write_report(run_dir: Path, plots: Path, report: Path, title: str, expect: str | Path | None = None) -> Path:
    """The report; with `expect` (an expectations file, instella_recipes/pipeline/health.py) it starts with the
    check of this run against the ranges a healthy run shows."""
    records = read_records(run_dir)
    plots.mkdir(parents=True, exist_ok=True)
    import torch

    lines = [
        f"# {title}",
        "",
        f"Run folder `{run_dir}`, written {time.strftime('%Y-%m-%d %H:%M:%S')} on {machine()} ({platform.machine()}, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, Python {platform.python_version()}). "
        f"Each stage's command and log are in `{run_dir}/pipeline/<stage>.json` and `{run_dir}/logs/<stage>.log`.",
        "",
    ]
    link = Path(os.path.relpath(plots, report.parent))
    if expect:
        lines += health_section(records, expect)
    lines += overrides_section(records)
    lines += wall_time_section(records, plots, link)
    lines += loss_section(records, plots, link)
    lines += grpo_section(records, plots, link)
    lines += eval_section(records, plots, link)
    lines += speculative_section(records)
    atomic_write_text(report, "\n".join(lines))
    return report


@dataclass
class PipelineReportArguments:
    run_dir: str = field(metadata={"help": "the pipeline's output_dir (holds pipeline/, logs/ and stage outputs)"})
    output_dir: str | None = field(default=None, metadata={"help": "folder for the PNGs (default <run_dir>/report)"})
    report: str | None = field(default=None, metadata={"help": "markdown file (default <run_dir>/report.md)"})
    title: str = field(default="Instella recipe: tiny end-to-end demo", metadata={"help": "report title"})
    expect: str | None = field(
        default=None,
        metadata={"help": "ranges a healthy run shows (e.g. eval/expected/tiny_demo.yaml), checked first"},
    )


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> Path:
    """Write the report and its plots; the plots folder gets a manifest last (it is a pipeline stage's output)."""
    (args,) = parse_recipe([PipelineReportArguments], argv)
    setup_logging()
    run_dir = Path(args.run_dir)
    plots = Path(args.output_dir) if args.output_dir else run_dir / "report"
    report = Path(args.report) if args.report else run_dir / "report.md"
    done = complete_stage(plots)
    if done is not None and done["stage"] != "report":
        check_output_dir(plots, what="output_dir")  # another stage's complete output: refused (the rule of core.io)
    retract_manifest(plots)  # an earlier report's plots are redrawn: its manifest goes first
    write_report(run_dir, plots, report, args.title, args.expect)
    print(f"report: {report} (plots in {plots})")
    return write_manifest(plots, "report", report=str(report), plots=sorted(p.name for p in plots.glob("*.png")))
