"""Write eval/tasks/ (our lm-eval suites and their offline twins) from lm-eval's own task YAMLs.

    python scripts/make_eval_tasks.py            # rewrite eval/tasks/ (run after upgrading lm-eval; commit the diff)
    python scripts/make_eval_tasks.py --check    # exit 1 if the shipped YAMLs differ from what this writes (CI)

What is generated and why: `instella_recipes/evaluation/tasks.py`.
"""

from instella_recipes.evaluation.tasks import main

if __name__ == "__main__":
    raise SystemExit(main())
