"""Every task YAML under eval/tasks loads with lm-eval alone (`lm_eval --include_path eval/tasks` from a clone, our
package not installed), so the suites can be proposed upstream: the task code they name lives next to them
(eval/tasks/olmes/olmes.py and olmes_task.py, as lm-eval's own tasks keep their utils.py).

In a subprocess where `instella_recipes` and `modeling_instella` cannot be imported (an import hook refuses them),
lm-eval's own YAML loader reads every YAML with its `!function` references resolved, its TaskManager indexes the
folder, and the offline OLMES tasks (shipped rows: no download) are built and render their requests. Generic over
the folder: tasks added later are checked too.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
from pathlib import Path

class NoProject:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("instella_recipes", "modeling_instella"):
            raise ModuleNotFoundError(f"{name} is blocked: the task YAMLs must load with lm-eval alone")
        return None

sys.meta_path.insert(0, NoProject())
from lm_eval.tasks import TaskManager
from lm_eval.tasks._yaml_loader import load_yaml

tasks_dir = Path(sys.argv[1])
failures = {}
paths = sorted(tasks_dir.rglob("*.yaml"))
for path in paths:
    try:
        load_yaml(path, resolve_func=True)
    except Exception as error:
        failures[str(path.relative_to(tasks_dir))] = f"{type(error).__name__}: {error}"
manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
built = {}
names = [n for n in manager.all_subtasks if n.startswith("olmes_") and n.endswith("_offline")]
for name in names:
    try:
        task = manager.load_task_or_group([name])[name]
        chat = bool((getattr(task, "olmes", None) or {}).get("chat"))  # the instruct settings: a chat template
        template = lambda messages, add_generation_prompt=True: "|".join(m["content"] for m in messages)
        task.build_all_requests(limit=1, apply_chat_template=chat, chat_template=template if chat else None)
        built[name] = len(task.instances)
    except Exception as error:
        failures[name] = f"{type(error).__name__}: {error}"
blocked = [m for m in sys.modules if m.split(".")[0] in ("instella_recipes", "modeling_instella")]
print("RESULT " + json.dumps({"yamls": len(paths), "built": built, "failures": failures, "imported": blocked}))
"""


@pytest.mark.slow
def test_every_task_yaml_loads_with_lm_eval_alone(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(ROOT / "eval" / "tasks")],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"},
    )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert done.returncode == 0 and line, done.stderr[-4000:]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["failures"] == {}
    assert result["imported"] == []
    assert result["yamls"] >= 240
    assert len(result["built"]) >= 15 and all(n > 0 for n in result["built"].values())
