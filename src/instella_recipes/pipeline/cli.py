"""`scripts/pipeline.py`: run a model's whole recipe as one stage graph.

    python scripts/pipeline.py --config recipes/tiny/pipeline.yaml [--output_dir runs/demo] [--set steps=20]

Each stage is one of the project's entry points (or `lm_eval`) with its recipe and overrides, run as a subprocess in
dependency order; logs go to `<output_dir>/logs/<stage>.log`. Re-running skips the stages whose outputs are
complete (manifest present, same recipe, arguments and inputs) and redoes the rest. `--stage NAME` runs one stage
(or one matrix entry, e.g. all three stage-2 seeds) after checking that its inputs are complete, which is how a
cluster runs the published recipe stage by stage. `--executor slurm` submits each stage as one sbatch job chained
to its inputs' jobs (`--wait` follows them; see `pipeline.slurm` and docs/slurm.md). The file format is described
in `pipeline.graph` and docs/pipeline.md.
"""

import shlex
import signal
import sys
import time
from dataclasses import dataclass, field

from instella_recipes.core import (
    RecipeError,
    config_path,
    exit_on_recipe_error,
    parse_assignments,
    parse_recipe,
    setup_logging,
)

from .graph import Pipeline, PipelineStage, load_pipeline
from .runner import StageFailed, plan, run_pipeline, unchecked_inputs_note
from .slurm import submit, wait_for_jobs


@dataclass
class PipelineArguments:
    output_dir: str | None = field(
        default=None, metadata={"help": "Folder for all stage outputs, logs and the report (default: the YAML's)."}
    )
    stage: list[str] = field(
        default_factory=list, metadata={"help": "Run only these stages or matrix entries (repeatable)."}
    )
    set: list[str] = field(default_factory=list, metadata={"help": "VAR=VALUE overrides of `vars` (repeatable)."})
    force: bool = field(default=False, metadata={"help": "Run the selected stages even if they are complete."})
    dry_run: bool = field(default=False, metadata={"help": "Print each stage's status and command; run nothing."})
    verbose: bool = field(default=False, metadata={"help": "Also stream every stage's output to the console."})
    executor: str = field(
        default="local",
        metadata={"help": "local: run the stages here, one after another; slurm: one sbatch job per stage.",
                  "choices": ["local", "slurm"]},
    )  # fmt: skip
    wait: bool = field(
        default=False, metadata={"help": "slurm: follow the jobs to the end (else return after submitting)."}
    )
    slurm: list[str] = field(
        default_factory=list,
        metadata={"help": "slurm: [stage.]KEY=VALUE resource override, e.g. time=01:00:00 (repeatable)."},
    )


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """Load and resolve the pipeline once, then run it here (`runner`) or submit it (`slurm`); 0 when done."""
    argv = list(sys.argv[1:] if argv is None else argv)
    (args,) = parse_recipe(
        [PipelineArguments],
        argv,
        config_help="Pipeline YAML (the stage graph), e.g. recipes/tiny/pipeline.yaml.",
        config_is_input=True,
    )
    path = config_path(argv)
    if path is None:
        raise RecipeError("--config is required: the pipeline YAML, e.g. recipes/tiny/pipeline.yaml")
    setup_logging()
    pipeline = load_pipeline(path, args.output_dir, parse_assignments(args.set))
    only = [stage for name in args.stage for stage in pipeline.select(name)] if args.stage else None
    if args.executor == "slurm":
        return _slurm(pipeline, only, args)
    if args.dry_run:
        return _dry_run(pipeline, only or pipeline.stages, args.force)
    try:
        summary = run_pipeline(pipeline, only, force=args.force, verbose=args.verbose)
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:  # SIGINT, or SIGTERM/SIGHUP (PipelineInterrupted): the stage was stopped
        print(f"\n{err or 'interrupted'}: run the same command again to resume (complete stages are skipped)",
              file=sys.stderr)  # fmt: skip
        return 128 + getattr(err, "signum", signal.SIGINT)
    total = sum(row["wall_s"] or 0 for row in summary if row["action"] == "ran")
    ran = sum(row["action"] == "ran" for row in summary)
    skipped = len(summary) - ran
    print(f"pipeline complete: {ran} stage(s) ran in {total:.0f}s, {skipped} skipped; outputs: {pipeline.output_dir}")
    return 0


def _dry_run(pipeline: Pipeline, stages: list[PipelineStage], force: bool) -> int:
    """Each stage's status, whether it would run and why, and its command line; nothing runs."""
    steps = plan(pipeline, stages, force=force)
    for stage, status, why in steps:
        print(f"# {stage.name}: {status} -> " + (f"runs ({why})" if why else "skipped"))
        print(shlex.join(stage.resolved.argv))
        note = unchecked_inputs_note(pipeline, stage)
        if note:
            print(note)
    runs = [stage.name for stage, _, why in steps if why]
    print(f"# would run {len(runs)} of {len(steps)} stage(s)" + (f": {', '.join(runs)}" if runs else ""))
    return 0


def _slurm(pipeline: Pipeline, only: list[PipelineStage] | None, args: PipelineArguments) -> int:
    """Submit the stages as dependent sbatch jobs (`pipeline.slurm`); with --wait, follow them."""
    jobs = submit(pipeline, only or pipeline.stages, args.set, args.slurm, args.force, args.dry_run)
    if args.dry_run:
        return 0
    if not jobs:
        print(f"pipeline complete: nothing to submit; outputs: {pipeline.output_dir}")
        return 0
    if not args.wait:
        print(f"submitted {len(jobs)} job(s); follow them with: squeue -j {','.join(jobs.values())}")
        return 0
    start = time.monotonic()
    problem = wait_for_jobs(pipeline, jobs)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 1
    print(f"pipeline complete: {len(jobs)} job(s) in {time.monotonic() - start:.0f}s; outputs: {pipeline.output_dir}")
    return 0
