"""`prepare_data --layout olmo --executor local|slurm --tasks N`: the groups of every source (dolma's `processes`,
200 per source in the authors' recipes) spread over N datatrove tasks, on this machine or as a Slurm job array.

The engine is HF datatrove (`LocalPipelineExecutor`, `SlurmPipelineExecutor`): it runs the tasks (`workers` at a
time), writes a completion marker per finished task (`completions/NNNNN`), per-task logs and stats, and skips finished
tasks when the run is started again; under Slurm it submits the array and the step that depends on it. What a task
runs is `token_tasks.TokenGroupsStep`, a datatrove step around our byte-exact group writer.

- This process checks everything (`olmo_layout.plan_token_files`: the recipe, every source's files, the tokenizer,
  the output-folder rule), opens each destination's partial folder and writes `<output_dir>.tasks/<key>/plan.json`
  (the groups and what decides their bytes) with the tokenizer beside it.
- The last step (here after the tasks; under Slurm a job that runs `afterok` the array) finds every group done and
  writes each destination's manifest, then `token_files.txt` and the root manifest: nothing looks complete before.

`<key>` hashes the planned sources and N, so a second run of the same recipe with the same N finds the tasks'
completion markers; another N (or other inputs) gets a new folder, and the groups already written are kept. One run
at a time writes an output_dir (a lock beside it; under Slurm, the run's jobs still queued or running).
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

from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger as task_logger

from instella_recipes.core import MANIFEST, RecipeError, file_digest, get_logger
from instella_recipes.data import olmo_layout
from instella_recipes.data.olmo_layout import TokenWork, plan_token_files
from instella_recipes.data.token_tasks import PLAN, SLURM_JOBS, TOKENIZER, TokenGroupsStep, tasks_root

logger = get_logger(__name__)

_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "SUSPENDED"}


def _plan_record(args, work: TokenWork, tasks: int) -> dict:
    sources = []
    for plan in work.plans:
        sample = plan.sample
        sources.append({
            "name": plan.source.name, "dest": str(plan.dest), "work": str(plan.work), "digest": plan.digest,
            "groups": plan.groups, "settings": asdict(plan.settings),
            "sizes": {p: os.stat(p).st_size for g in plan.groups for p in g},
            "sample": [sample.fraction, sample.seed, sample.source, sample.base] if sample else None,
        })  # fmt: skip
    items = [[i, g] for i, s in enumerate(sources) for g in range(len(s["groups"]))]
    tokenizer = Path(args.tokenizer)
    tokenizer = tokenizer if tokenizer.is_file() else tokenizer / "tokenizer.json"
    return {
        "tasks": tasks, "items": items, "tokenizer": args.tokenizer,
        "tokenizer_file": str(tokenizer) if tokenizer.is_file() else None,
        "tokenizer_file_sha256": file_digest(tokenizer) if tokenizer.is_file() else None,
        "eos_id": work.eos_id, "dtype": work.dtype.str, "sources": sources,
    }  # fmt: skip


def _run_folder(args, record: dict) -> Path:
    key = {"sources": [(s["dest"], s["digest"]) for s in record["sources"]], "tasks": record["tasks"]}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return tasks_root(args.output_dir) / f"{digest}-{record['tasks']}tasks"


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
        (folder / TOKENIZER).write_text(work.tok.to_str())
        plan_file.write_text(json.dumps(record, indent=1) + "\n")
        step = TokenGroupsStep(str(plan_file), args.num_proc or 1)
        if args.executor == "slurm":
            jobs = _submit(args, folder, step)
            if args.wait:
                _wait_for(jobs, work.root, folder)
            return work.root
        # start_method fork, not datatrove's default forkserver, whose children import scripts/prepare_data.py
        # (torch, datasets, transformers) again: group_writer.py says what that cost
        executor = LocalPipelineExecutor(
            [step], tasks=args.tasks, workers=args.workers or 1, logging_dir=str(folder / "datatrove"),
            start_method="fork",
        )  # fmt: skip
        executor.run()
        missing = executor.get_incomplete_ranks()
        if missing:  # a task failed in a worker process (its error is in its log)
            raise RecipeError(
                f"tasks {missing} of {args.tasks} did not finish (logs: {folder / 'datatrove' / 'logs'}); run "
                f"prepare_data again: finished tasks are skipped"
            )
        return olmo_layout.finish_token_files(args, work)


def _wait_for(jobs: dict, root: Path, folder: Path, poll_s: float = 5.0) -> None:
    """Until the run's jobs left the queue; the run is complete when the finishing job wrote the root manifest."""
    while _slurm_states(list(jobs.values())) & _ACTIVE:
        time.sleep(poll_s)
    if not (root / MANIFEST).is_file():
        raise RecipeError(
            f"the prepare_data jobs {jobs['tasks']} (tasks) and {jobs['finish']} (finish) ended without finishing "
            f"{root} (logs: {folder}); run prepare_data again: the finished groups are kept"
        )


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


def _submit(args, folder: Path, step: TokenGroupsStep) -> dict:
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
    return jobs
