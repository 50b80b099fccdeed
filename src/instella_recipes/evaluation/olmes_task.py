"""OLMES's `OlmesTask`: `eval/tasks/olmes/olmes_task.py`, kept next to the task YAMLs so
that lm-eval loads them with our package not installed (`lm_eval --include_path eval/tasks`). This module is that
file, loaded once per process under the name lm-eval's YAML loader gives it, so the library, the tests and lm-eval
share one module object. The library imports the task code, never the reverse."""

import importlib.util
import sys

from instella_recipes.core.paths import TASKS_DIR

_spec = importlib.util.spec_from_file_location("_olmes_task_loader", TASKS_DIR / "olmes" / "olmes_task.py")
_loader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loader)
sys.modules[__name__] = _loader.load_sibling("olmes_task")
