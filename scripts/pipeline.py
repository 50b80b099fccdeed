"""Run a model's whole recipe as one stage graph: `python scripts/pipeline.py --config recipes/tiny/pipeline.yaml`.

Each stage is one of the project's entry points (or `lm_eval`) with its recipe and overrides, run as a subprocess in
dependency order; logs go to `<output_dir>/logs/<stage>.log`. Re-running skips the stages whose outputs are
complete (manifest present, same recipe, arguments and inputs) and redoes the rest. `--stage NAME` runs one stage
(or one matrix entry, e.g. all three stage-2 seeds) after checking that its inputs are complete, which is how a
cluster runs the published recipe stage by stage. The format is described in `instella_recipes/pipeline/graph.py` and
docs/pipeline.md.
"""

import argparse
import shlex
import sys

from instella_recipes.core import exit_on_recipe_error
from instella_recipes.pipeline.graph import command_line, load_pipeline
from instella_recipes.pipeline.runner import StageFailed, run_pipeline, stage_status


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--config", required=True, help="pipeline YAML, e.g. recipes/tiny/pipeline.yaml")
    parser.add_argument("--output_dir", help="folder for all stage outputs, logs and the report (default: the YAML's)")
    parser.add_argument("--stage", action="append", help="run only this stage or matrix entry (repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="VAR=VALUE", help="override a `vars` entry")
    parser.add_argument("--force", action="store_true", help="run the selected stages even if they are complete")
    parser.add_argument("--dry_run", action="store_true", help="print each stage's status and command; run nothing")
    parser.add_argument("--verbose", action="store_true", help="also stream every stage's output to the console")
    return parser.parse_args(argv)


def _overrides(items: list[str]) -> dict:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"error: --set expects VAR=VALUE, got '{item}'")
        out[key] = value
    return out


@exit_on_recipe_error
def main(argv=None) -> int:
    args = parse_args(argv)
    pipeline = load_pipeline(args.config, args.output_dir, _overrides(args.set))
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
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume (complete stages are skipped)", file=sys.stderr)
        return 130
    total = sum(row["wall_s"] or 0 for row in summary if row["action"] == "ran")
    ran = sum(row["action"] == "ran" for row in summary)
    skipped = len(summary) - ran
    print(f"pipeline complete: {ran} stage(s) ran in {total:.0f}s, {skipped} skipped; outputs: {pipeline.output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
