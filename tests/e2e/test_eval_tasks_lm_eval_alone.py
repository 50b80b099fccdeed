"""Every task YAML under eval/tasks loads with lm-eval alone (`lm_eval --include_path eval/tasks` from a clone, our
package not installed), so the suites can be proposed upstream: the task code they name lives next to them
(eval/tasks/olmes/olmes.py and olmes_task.py, as lm-eval's own tasks keep their utils.py).

In a subprocess where `instella_recipes` and `modeling_instella` cannot be imported (an import hook refuses them),
lm-eval's own YAML loader reads every YAML with its `!function` references resolved, its TaskManager indexes the
folder, the offline OLMES tasks (shipped rows: no download) are built and render their requests, and every group is
read by lm-eval's `Group.from_config`, its members known and the metric it aggregates one each of its leaf tasks
reports (lm-eval averages a group over its leaf tasks). Generic over the folder: tasks added later are checked too.
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
from lm_eval.api.group import Group

index = manager.task_index
groups, outside = {}, set()
for name, entry in index.items():
    if "group" not in entry.cfg:
        continue
    try:
        Group.from_config(entry.cfg)  # lm-eval's GroupConfig: keys, aggregate_metric_list
        children = [c if isinstance(c, str) else c.get("group") or c.get("task") for c in entry.cfg["task"]]
        outside |= {c for c in children if c not in index}  # lm-eval's own: test_eval_suites checks them
        for agg in entry.cfg.get("aggregate_metric_list") or []:  # lm-eval averages it over the leaf tasks
            stack, leaves = [c for c in children if c in index], []
            while stack:
                child = index[stack.pop()].cfg
                if "group" in child:
                    stack += [c if isinstance(c, str) else c.get("group") or c.get("task") for c in child["task"]]
                else:
                    leaves.append(child)
            metrics = [(t["task"], {m["metric"] for m in t.get("metric_list", [])}) for t in leaves]
            lacking = [task for task, names in metrics if agg["metric"] not in names]
            assert not lacking, f"{agg['metric']} is not a metric of {lacking}"
        groups[name] = len(children)
    except Exception as error:
        failures[name] = f"{type(error).__name__}: {error}"
blocked = [m for m in sys.modules if m.split(".")[0] in ("instella_recipes", "modeling_instella")]
result = {"yamls": len(paths), "built": built, "groups": groups, "outside": sorted(outside), "failures": failures,
          "imported": blocked}
print("RESULT " + json.dumps(result))
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
    assert len(result["groups"]) >= 19  # every group YAML, read by lm-eval, its aggregated metric its tasks'
    assert "mmlu" in result["outside"] and not any(n.startswith("olmes_") for n in result["outside"])
