"""Write eval/tasks/ (our lm-eval suites and their offline twins) from lm-eval's own task YAMLs.

    python scripts/make_eval_tasks.py            # rewrite eval/tasks/ (run after upgrading lm-eval; commit the diff)
    python scripts/make_eval_tasks.py --check    # exit 1 if the shipped YAMLs differ from what this writes (CI)

What is generated and why: `instella_recipes/evaluation/tasks.py`.
"""

import sys
from dataclasses import dataclass, field

from instella_recipes.core import exit_on_recipe_error, get_logger, parse_recipe, setup_logging
from instella_recipes.core.paths import TASKS_DIR
from instella_recipes.evaluation.tasks import generated_files, stale_files

logger = get_logger("instella_recipes.scripts.make_eval_tasks")


@dataclass
class MakeTasksArguments:
    check: bool = field(default=False, metadata={"help": "Only report YAMLs that differ; exit 1 if any."})


@exit_on_recipe_error
def main(argv=None) -> int:
    (args,) = parse_recipe([MakeTasksArguments], argv)
    setup_logging()
    if args.check:
        stale = stale_files()
        for path in stale:
            logger.error(f"stale: {path} (run python scripts/make_eval_tasks.py)")
        return 1 if stale else 0
    files = generated_files()
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    logger.info(f"wrote {len(files)} YAMLs under {TASKS_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
