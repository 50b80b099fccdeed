"""The evaluation stage (`scripts/evaluate.py`): checks of an lm-eval run before any model work, then the exact
`lm_eval` command it hands over to, unchanged.

It runs `lm_eval --model hf --model_args pretrained=<dir>,trust_remote_code=True --include_path eval/tasks
--tasks ...` (plus the user's extra arguments) after checking, from configs, tokenizers and the task data only:
- the model folder exists and is a model (config.json readable, tokenizer loadable);
- every task or group name is known (ours under eval/tasks, or lm-eval's own);
- the instruct suite (chat-formatted, so `--apply_chat_template` is added) is not mixed with base-model tasks, and the
  model has a chat template for it;
- no few-shot prompt (context + continuation, or context + max_gen_toks for generation) is longer than the model's
  context (lm-eval itself would silently cut the prompt from the left and score a different task).
The context check builds the requests of tasks whose data is local (the offline suites); online tasks are checked
for their names only, since building them downloads the datasets.
"""

import os
import re
import shutil
import sys
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
from instella_recipes.core.paths import TASKS_DIR
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


def split_tasks(names: list[str]):
    """(TaskManager over eval/tasks, our names whose data is local, names left to lm-eval); unknown names raise."""
    from lm_eval.tasks import TaskManager

    ours = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
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


def lm_eval_command(args, extra: list[str]) -> list[str]:
    lm_eval = shutil.which("lm_eval") or shutil.which("lm-eval")
    base = [lm_eval] if lm_eval else [sys.executable, "-m", "lm_eval"]
    cmd = base + [
        "--model", "hf", "--model_args", f"pretrained={args.model_dir},trust_remote_code=True",
        "--include_path", str(TASKS_DIR), "--tasks", ",".join(args.task_list),
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


def preflight(model_dir, tasks, num_fewshot=None, limit=None) -> int:
    """All checks; returns how many requests were checked against the context (local-data tasks only)."""
    config, tokenizer = check_model_dir(model_dir)
    chat = is_chat(list(tasks))
    manager, local, _upstream = split_tasks(tasks)
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
    check_only: bool = field(default=False, metadata={"help": "Run the checks, not the evaluation."})

    def __post_init__(self):
        if not self.model_dir or not self.tasks:
            raise ValueError("--model_dir and --tasks are required")
        check_range("num_fewshot", self.num_fewshot, 0, integer=True, allow_none=True)
        check_range("limit", self.limit, 1, integer=True, allow_none=True)
        self.task_list = [t for t in self.tasks.split(",") if t]


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/evaluate.py`: the checks, then `lm_eval` in this process's place (unless --check_only)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    (args,) = parse_recipe([EvaluateArguments], argv)
    setup_logging()
    checked = preflight(args.model_dir, args.task_list, args.num_fewshot, args.limit)
    logger.info(f"checks passed ({checked} requests fit the model's context)")
    if args.check_only:
        return 0
    cmd = lm_eval_command(args, extra)
    os.execv(cmd[0], cmd)  # the real CLI, in this process's place
    return 0  # unreachable
