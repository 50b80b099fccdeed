"""Where the repository's data folders are, for code that runs from a clone (`pip install -e .`).

The library is installed; the recipes (YAML), the lm-eval task folder and the accelerate configs are data that stay
in the clone, as in alignment-handbook. Code that needs them by default finds them here and says what to pass when
the package is used without a clone.
"""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
RECIPES_DIR = REPO_ROOT / "recipes"
EVAL_DIR = REPO_ROOT / "eval"
TASKS_DIR = EVAL_DIR / "tasks"
PUBLISHED_DIR = EVAL_DIR / "published"
EVAL_DATA_DIR = EVAL_DIR / "data"
ACCELERATE_CONFIGS_DIR = REPO_ROOT / "accelerate_configs"
