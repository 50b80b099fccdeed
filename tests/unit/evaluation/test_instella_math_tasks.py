"""The Instella-Math lm-eval tasks: the DeepScaleR protocol in every task YAML (16 samples, T 0.6, top-p 0.95, 28,000
new tokens), pass@1 = mean over all samples and pass@16 through lm-eval's own evaluator on the offline stand-ins, and
every YAML loading with lm-eval alone (the project's package not importable)."""

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from lm_eval.api.model import LM
from lm_eval.tasks import TaskManager

ROOT = Path(__file__).resolve().parents[3]
TASKS = ROOT / "eval" / "tasks" / "instella_math"
NAMES = ["aime24", "aime25", "math500", "amc", "olympiadbench", "minerva", "gsm8k", "gpqa"]
ANSWERS = {  # the stand-ins' answers, as a model would box them
    "aime24": ["24", "24", "323"], "aime25": ["12", "243", "10"], "math500": ["\\dfrac{3}{4}", "2", "(-2, 2)"],
    "amc": ["55", "144", "63"], "olympiadbench": ["23", "7", "4"], "minerva": ["60", "4.8", "2000"],
    "gsm8k": ["7", "30", "12"], "gpqa": ["B", "C", "A"],
}  # fmt: skip


def _raw(name: str) -> dict:
    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("!function", lambda loader, node: loader.construct_scalar(node))
    return yaml.load((TASKS / f"instella_math_{name}.yaml").read_text(), Loader=Loader)


@pytest.mark.parametrize("name", NAMES)
def test_each_task_uses_the_deepscaler_protocol_on_the_authors_data(name):
    cfg = _raw(name)
    assert cfg["repeats"] == 16 and cfg["filter_list"][0]["filter"] == [{"function": "take_first_k", "k": 16}]
    kw = cfg["generation_kwargs"]
    assert (kw["do_sample"], kw["temperature"], kw["top_p"], kw["max_gen_toks"]) == (True, 0.6, 0.95, 28000)
    assert [m["metric"] for m in cfg["metric_list"]] == ["pass@1", "pass@16"]
    assert (
        "/65534d33d47a4d1d97b6e73b35bdf169968a851c/evals/deepscaler/data_processed/"
        in (cfg["dataset_kwargs"]["data_files"]["test"])
    )


class SampleLM(LM):
    """Answers every problem with 16 samples of which the first `right` are correct (boxed answer) and the rest
    wrong, so pass@1 = right / 16 and pass@16 = (right > 0) on every task."""

    def __init__(self, right: int):
        super().__init__()
        self.right, self.seen = right, {}
        self.answers = {}
        for name in NAMES:
            manager = TaskManager(include_path=str(TASKS), include_defaults=False)
            task = manager.load_task_or_group([f"instella_math_{name}_offline"])[f"instella_math_{name}_offline"]
            for doc, answer in zip(task.test_docs(), ANSWERS[name]):
                self.answers[doc["prompt"][0]["content"]] = answer

    def generate_until(self, requests, disable_tqdm=False):
        out = []
        for request in requests:
            prompt = request.args[0]
            k = self.seen[prompt] = self.seen.get(prompt, 0) + 1
            right = k <= self.right
            out.append(f"Step by step... so the answer is \\boxed{{{self.answers[prompt] if right else '999'}}}.")
        return out

    def loglikelihood(self, requests, disable_tqdm=False):
        raise NotImplementedError

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError


@pytest.mark.parametrize("right", [0, 4])
def test_pass_at_1_is_the_mean_over_all_samples_and_pass_at_16_any(right):
    from lm_eval import simple_evaluate

    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    model = SampleLM(right)
    out = simple_evaluate(model=model, tasks=["instella_math_offline"], task_manager=manager)
    for name in NAMES:
        result = out["results"][f"instella_math_{name}_offline"]
        assert result["pass@1,all_samples"] == pytest.approx(right / 16), name
        assert result["pass@16,all_samples"] == (1.0 if right else 0.0), name
    assert set(model.seen.values()) == {16}  # each problem sampled 16 times


def test_every_task_loads_with_lm_eval_alone_and_scores_with_the_clones_grader():
    """A fresh interpreter where the project is not importable (as in a separate vLLM venv) builds every task and
    renders a prompt; scoring then imports the grader from this clone's src/ (utils.py's fallback)."""
    names = [f"instella_math_{n}_offline" for n in NAMES]
    probe = f"""
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "")]
sys.path = [p for p in sys.path if not p.rstrip("/").endswith("src") and p not in ("", ".")]
try:
    import instella_recipes
    raise SystemExit("the project is still importable: the probe tests nothing")
except ModuleNotFoundError:
    pass
from lm_eval.tasks import TaskManager
tasks = TaskManager(include_path={str(TASKS)!r}, include_defaults=False).load_task_or_group({names!r})
for name in {names!r}:
    task = tasks[name]
    doc = next(iter(task.test_docs()))
    assert task.doc_to_text(doc).endswith(r"within \\boxed{{}}."), task.doc_to_text(doc)
assert "instella_recipes" not in sys.modules
print("loaded", len(tasks))
sys.path.insert(0, {str(TASKS)!r})
import utils
doc = {{"reward_model": {{"ground_truth": ["9.6"]}}}}
print(utils.process_results(doc, [[r"so \\boxed{{9.6}}", r"\\boxed{{9}}"]]))
"""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home())}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded 8" in done.stdout and "{'pass@1': 0.5, 'pass@2': 1.0}" in done.stdout
