"""`prepare_data --layout olmo --executor local|slurm --tasks N`: the groups of every source (dolma's `processes`,
200 per source in the authors' recipes) spread over N datatrove tasks, on this machine or as a Slurm job array.

The engine is HF datatrove (`LocalPipelineExecutor`, `SlurmPipelineExecutor`): it runs the tasks (`workers` at a
time), writes a completion marker per finished task (`completions/NNNNN`), per-task logs and stats, and skips finished
tasks when the run is started again; under Slurm it submits the array and the step that depends on it. What a task
runs is a datatrove `PipelineStep` around our group writer (`olmo_layout.write_plan_groups`, the byte-exact one):

- This process checks everything (`olmo_layout.plan_token_files`: the recipe, every source's files, the tokenizer,
  the output-folder rule), opens each destination's partial folder and writes `<output_dir>.tasks/<key>/plan.json`:
  the groups and what decides their bytes. Group k of the run's list goes to task k mod N; each group is written by
  exactly one task, named as dolma names it, so the bytes depend on the groups, never on N.
- A task checks what it can only check on its node (the tokenizer file is the planned one, its input files are
  there with the planned sizes, the partial folder is still this run's), then writes its groups not yet recorded
  as done (a task killed mid-group rewrites that group from its start; other groups stay).
- The last step (here after the tasks; under Slurm a job that runs `afterok` the array) finds every group done and
  writes each destination's manifest, then `token_files.txt` and the root manifest: nothing looks complete before.

`<key>` hashes the planned sources and N, so a second run of the same recipe with the same N finds the tasks'
completion markers; another N (or other inputs) gets a new folder, and the groups already written are kept.
"""

import fcntl
import hashlib
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger as task_logger
from tokenizers import Tokenizer

from instella_recipes.core import RecipeError, get_logger
from instella_recipes.data import olmo_layout
from instella_recipes.data.dolma_tokens import DolmaTokensArguments
from instella_recipes.data.olmo_layout import TokenSource, TokenWork, _Plan, plan_token_files
from instella_recipes.data.sampling import DocumentSample
from instella_recipes.data.tokenizer import load_tokenizer

logger = get_logger(__name__)

PLAN = "plan.json"
SLURM_JOBS = "slurm_jobs.json"
_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def tasks_root(output_dir: str | Path) -> Path:
    """Where the runs' datatrove folders live: beside output_dir, as its `.partial` folders do."""
    return Path(f"{Path(output_dir)}.tasks")


def assigned(items: list, rank: int, world_size: int) -> list:
    """The groups task `rank` of `world_size` writes: every world_size-th of the run's list, from `rank`."""
    return items[rank::world_size]


# -- the plan a task reads -------------------------------------------------------------------------------------------
def _plan_record(args, work: TokenWork, tasks: int) -> dict:
    sources = []
    for plan in work.plans:
        files = {p: os.stat(p).st_size for g in plan.groups for p in g}
        sample = plan.sample
        sources.append({
            "name": plan.source.name, "dest": str(plan.dest), "work": str(plan.work), "digest": plan.digest,
            "groups": plan.groups, "settings": asdict(plan.settings), "sizes": files,
            "sample": [sample.fraction, sample.seed, sample.source, sample.base] if sample else None,
        })  # fmt: skip
    items = [[i, g] for i, s in enumerate(sources) for g in range(len(s["groups"]))]
    return {
        "args": {k: v for k, v in vars(args).items() if not k.startswith("_")}, "tasks": tasks, "items": items,
        "tokenizer": work.meta["tokenizer"], "tokenizer_sha256": work.meta["tokenizer_sha256"],
        "eos_id": work.eos_id, "dtype": work.dtype.str, "sources": sources,
    }  # fmt: skip


def _run_folder(args, record: dict) -> Path:
    key = {"sources": [(s["dest"], s["digest"]) for s in record["sources"]], "tasks": record["tasks"]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return tasks_root(args.output_dir) / f"{digest}-{record['tasks']}tasks"


def _load_tokenizer(record: dict):
    """The tokenizer as this node has it, refused when it is not the one the run was planned with."""
    path = record["tokenizer"]
    try:
        if Path(path).is_file():
            tok = Tokenizer.from_file(path)
        else:
            tok = load_tokenizer(path).backend_tokenizer
    except Exception as err:  # a missing or unreadable file on this node: one line naming it
        raise RecipeError(f"tokenizer {path} on {socket.gethostname()}: cannot be read ({err})") from None
    sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
    if sha != record["tokenizer_sha256"]:
        raise RecipeError(
            f"tokenizer {path} on {socket.gethostname()} is not the one this run was planned with (sha256 {sha[:12]} "
            f"vs {record['tokenizer_sha256'][:12]}): give every node the same file, then run again"
        )
    return tok


def _task_plan(source: dict) -> _Plan:
    """A source's plan as a task needs it, checked against this node: the partial folder is this run's, and every
    input file of its groups is here with its planned size."""
    work = Path(source["work"])
    state = work / olmo_layout._STATE
    if not state.is_file() or json.loads(state.read_text()).get("fingerprint") != source["digest"]:
        raise RecipeError(
            f"{work} is not this run's partial folder any more (another prepare_data run on the same output_dir "
            f"reset it, or it is finished); run prepare_data again"
        )
    for path, size in source["sizes"].items():
        if not os.path.isfile(path):
            raise RecipeError(
                f"source '{source['name']}': input file {path} is missing on {socket.gethostname()}; make it "
                f"visible there (shared storage), then run again: the finished groups are kept"
            )
        if os.stat(path).st_size != size:
            raise RecipeError(
                f"source '{source['name']}': input file {path} on {socket.gethostname()} has "
                f"{os.stat(path).st_size} bytes, planned with {size}: it changed; run prepare_data again"
            )
    sample = DocumentSample(*source["sample"]) if source["sample"] else None
    plan = _Plan(TokenSource(source["name"], source["dest"], source["work"]), Path(source["dest"]), None)
    plan.work, plan.groups, plan.sample = work, source["groups"], sample
    plan.settings = DolmaTokensArguments(**source["settings"])
    return plan


class TokenGroupsStep(PipelineStep):
    """A datatrove step: task `rank` writes its share of the run's groups (`assigned`) with our group writer,
    `num_proc` worker processes at a time, and reports groups, documents and tokens as datatrove stats."""

    name = "token groups"
    type = "prepare_data"

    def __init__(self, plan_file: str, num_proc: int = 1):
        super().__init__()
        self.plan_file, self.num_proc = plan_file, num_proc

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        record = json.loads(Path(self.plan_file).read_text())
        mine = assigned(record["items"], rank, world_size)
        tok = _load_tokenizer(record)
        by_source: dict[int, list[int]] = {}
        for i, g in mine:
            by_source.setdefault(i, []).append(g)
        plans = {i: _task_plan(record["sources"][i]) for i in by_source}  # every check before the first group
        dtype, start, written = np.dtype(record["dtype"]), time.monotonic(), 0
        for i, groups in by_source.items():
            plan = plans[i]
            todo = sorted(set(groups) - olmo_layout.done_groups(plan.work))
            for g in todo:
                with self.track_time("group"):
                    olmo_layout.write_plan_groups(plan, [g], tok, record["eos_id"], dtype, self.num_proc)
                result = json.loads((plan.work / olmo_layout._DONE / f"{g}.json").read_text())
                tokens = sum(f["tokens"] for f in result["files"])
                self.stat_update("groups")
                self.stat_update("documents", value=sum(f["documents"] for f in result["files"]), unit="group")
                self.stat_update("tokens", value=tokens, unit="group")
                written += 1
                rate = tokens / max(time.monotonic() - start, 1e-9)
                task_logger.info(
                    f"task {rank}/{world_size}: {plan.source.name} group {g} done ({written} of {len(mine)} groups "
                    f"of this task, {tokens} tokens, {rate / 1e6:.2f}M tokens/s)"
                )
        task_logger.info(f"task {rank}/{world_size}: {len(mine)} groups done ({len(mine) - written} were already)")


class FinishStep(PipelineStep):
    """A datatrove step (the Slurm job after the array): every group is written, so plan the run again (every check,
    the partial folders resumed with nothing to do) and write the manifests and `token_files.txt`."""

    name = "finish"
    type = "prepare_data"

    def __init__(self, args):
        super().__init__()
        self.args = args  # the run's PrepareArguments (pickled with the executor)

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        work = plan_token_files(self.args)
        olmo_layout.finish_token_files(self.args, work)
        task_logger.info(f"prepare_data: {self.args.output_dir} complete")


# -- running the tasks -----------------------------------------------------------------------------------------------
@contextmanager
def _exclusive(output_dir: str):
    """One prepare_data run at a time on an output_dir (this machine: an flock beside it)."""
    folder = tasks_root(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            raise RecipeError(
                f"output_dir {output_dir} is being written by another prepare_data run ({handle.read().strip()}); "
                f"wait for it to end"
            ) from None
        handle.truncate(0)
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}")
        handle.flush()
        yield


def prepare_with_tasks(args) -> Path:
    """Check and plan (this process), run the groups as `args.tasks` datatrove tasks, then finish; under Slurm the
    array and the finishing job are submitted and this returns at once (`--status true` follows them)."""
    with _exclusive(args.output_dir):
        work = plan_token_files(args)
        if not work.plans:
            return olmo_layout.finish_token_files(args, work)
        record = _plan_record(args, work, args.tasks)
        folder = _run_folder(args, record)
        folder.mkdir(parents=True, exist_ok=True)
        plan_file = folder / PLAN
        plan_file.write_text(json.dumps(record, indent=1) + "\n")
        step = TokenGroupsStep(str(plan_file), args.num_proc or 1)
        if args.executor == "slurm":
            _submit(args, folder, step)
            return work.root
        executor = LocalPipelineExecutor(
            [step], tasks=args.tasks, workers=args.workers or 1, logging_dir=str(folder / "datatrove")
        )
        executor.run()
        missing = executor.get_incomplete_ranks()
        if missing:  # a task failed in a worker process (its error is in its log)
            raise RecipeError(
                f"tasks {missing} of {args.tasks} did not finish (logs: {folder / 'datatrove' / 'logs'}); run "
                f"prepare_data again: finished tasks are skipped"
            )
        return olmo_layout.finish_token_files(args, work)


def _slurm_states(job_ids: list[str]) -> set[str]:
    done = subprocess.run(["squeue", "-h", "-j", ",".join(job_ids), "-o", "%T"], capture_output=True, text=True)
    return set(done.stdout.split())


class _SlurmExecutor(SlurmPipelineExecutor):
    """datatrove's Slurm executor without a `--partition` line when none is given (the cluster's default partition;
    datatrove always writes one)."""

    def get_sbatch_args(self, max_array: int = 1) -> dict:
        out = super().get_sbatch_args(max_array)
        if not out.get("partition"):
            out.pop("partition", None)
        return out


def _submit(args, folder: Path, step: TokenGroupsStep) -> None:
    """The groups as a Slurm array (one task per array element, `num_proc` CPUs each), and the finishing step as a
    job `afterok` the array (cancelled, not left pending, if a task fails)."""
    jobs_file = folder / SLURM_JOBS
    if jobs_file.is_file():
        jobs = json.loads(jobs_file.read_text())
        active = _slurm_states([jobs["tasks"], jobs["finish"]]) & _ACTIVE
        if active:
            raise RecipeError(
                f"this run's jobs {jobs['tasks']} (tasks) and {jobs['finish']} (finish) are still {sorted(active)}: "
                f"wait for them (--status true) or scancel them first"
            )
    common = {
        "time": args.slurm_time, "partition": args.slurm_partition or "", "qos": "", "mem_per_cpu_gb": 1,
        "env_command": f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH",
        "sbatch_args": {"kill-on-invalid-dep": "yes"}, "requeue": False,
    }  # fmt: skip
    tasks = _SlurmExecutor(
        [step], tasks=args.tasks, cpus_per_task=args.num_proc or 1, workers=args.workers or -1,
        job_name=f"prepare:{Path(args.output_dir).name}", logging_dir=str(folder / "datatrove"), **common,
    )  # fmt: skip
    finish = _SlurmExecutor(
        [FinishStep(args)], tasks=1, depends=tasks, job_name=f"prepare-finish:{Path(args.output_dir).name}",
        logging_dir=str(folder / "finish"), **common,
    )  # fmt: skip
    try:
        finish.run()  # launches `tasks` first (datatrove's depends), then itself afterok
    except subprocess.CalledProcessError as err:  # sbatch refused; its own message (stderr) is above
        raise RecipeError(
            f"sbatch refused the prepare_data tasks (exit {err.returncode}; its message is above)"
        ) from None
    jobs = {"tasks": str(tasks.job_id), "finish": str(finish.job_id)}
    jobs_file.write_text(json.dumps(jobs) + "\n")
    logger.info(
        f"prepare_data: submitted {args.tasks} tasks as job array {jobs['tasks']} and the finish as job "
        f"{jobs['finish']}; follow them with --status true (logs: {folder})"
    )


# -- status ----------------------------------------------------------------------------------------------------------
def task_status(args) -> list[str]:
    """Lines telling, for every run folder of this output_dir, which tasks are done (datatrove's completion markers)
    and how many groups each source has written."""
    root = tasks_root(args.output_dir)
    runs = sorted(p for p in root.glob("*/" + PLAN)) if root.is_dir() else []
    if not runs:
        return [f"{args.output_dir}: no task runs (prepare_data --executor local|slurm --tasks N starts one)"]
    lines = []
    for plan_file in runs:
        record = json.loads(plan_file.read_text())
        completions = plan_file.parent / "datatrove" / "completions"
        done = sorted(int(p.name) for p in completions.iterdir()) if completions.is_dir() else []
        todo = [r for r in range(record["tasks"]) if r not in done]
        lines.append(
            f"{plan_file.parent.name}: {len(done)} of {record['tasks']} tasks done; not done: {todo or 'none'}"
        )
        for source in record["sources"]:
            work, dest = Path(source["work"]), Path(source["dest"])
            if (dest / olmo_layout.MANIFEST).is_file() and not work.exists():
                lines.append(f"  {source['name']}: finished ({dest})")
                continue
            written = len(olmo_layout.done_groups(work)) if work.is_dir() else 0
            lines.append(f"  {source['name']}: {written} of {len(source['groups'])} groups written")
    manifest = Path(args.output_dir) / olmo_layout.MANIFEST
    lines.append(f"{args.output_dir}: {'complete' if manifest.is_file() else 'not complete'}")
    return lines
