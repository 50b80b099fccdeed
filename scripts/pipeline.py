"""Run a model's whole recipe as one stage graph: `python scripts/pipeline.py --config recipes/tiny/pipeline.yaml`.

Each stage is one of the project's entry points (or `lm_eval`) with its recipe and overrides, run as a subprocess in
dependency order; logs go to `<output_dir>/logs/<stage>.log`. Re-running skips the stages whose outputs are
complete (manifest present, same recipe, arguments and inputs) and redoes the rest. `--stage NAME` runs one stage
(or one matrix entry, e.g. all three stage-2 seeds) after checking that its inputs are complete, which is how a
cluster runs the published recipe stage by stage. The format is described in `instella_recipes/pipeline/graph.py` and
docs/pipeline.md.
"""

import shlex
import signal
import sys
from dataclasses import dataclass, field

from instella_recipes.core import RecipeError, config_path, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.pipeline.graph import command_line, load_pipeline
from instella_recipes.pipeline.runner import StageFailed, run_pipeline, stage_status


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


def _overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise RecipeError(f"--set expects VAR=VALUE, got '{item}'")
        out[key] = value
    return out


@exit_on_recipe_error
def main(argv=None) -> int:
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
    pipeline = load_pipeline(path, args.output_dir, _overrides(args.set))
    only = [stage for name in args.stage for stage in pipeline.select(name)] if args.stage else None
    if args.dry_run:
        for stage in only or pipeline.stages:
            print(f"# {stage.name}: {stage_status(pipeline, stage)}")
            print(shlex.join(command_line(pipeline, stage)))
        return 0
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


if __name__ == "__main__":
    sys.exit(main())
