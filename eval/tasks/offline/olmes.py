"""The OLMES task code for the offline twins: `../olmes/olmes.py`, the one module the online tasks use (lm-eval
resolves a YAML's `!function olmes.X` next to the YAML, and a reference cannot climb to a parent folder)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "_olmes_task_loader", Path(__file__).resolve().parent.parent / "olmes" / "olmes_task.py"
)
_loader = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loader)
_module = _loader.load_sibling("olmes")
globals().update({k: v for k, v in vars(_module).items() if not k.startswith("__")})
