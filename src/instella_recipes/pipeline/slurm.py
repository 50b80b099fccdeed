"""The Slurm executor of the pipeline (`scripts/pipeline.py --executor slurm`): each stage is one `sbatch` job.

Contract:
- Submission (`submit`) walks the stages in order. A complete stage is skipped (no job); a stage whose job from an
  earlier submission is still queued or running is not submitted again (its job id is reused for dependencies);
  every other stage becomes one job, chained to its inputs' jobs with `--dependency=afterok:<ids>` and
  `--kill-on-invalid-dep=yes` (a failed input cancels its dependents instead of leaving them pending forever with
  DependencyNeverSatisfied). The job ids are kept in `<output_dir>/pipeline/<stage>.slurm.json`.
- A job runs `python -m instella_recipes.pipeline.slurm job ...`, which runs that one stage with the local runner
  (same run record, same `logs/<stage>.log`, same completeness rules); the batch script's own output goes to
  `logs/<stage>.slurm.log`. A stage with more than one task (`nodes` x `ntasks_per_node`) and an
  `accelerate_config` runs one `accelerate launch` per task through `srun` (on a GPU cluster: one per node, each
  starting `gpus_per_node` processes; on CPU: one process per task, ranks from Slurm, gloo).
- Pre-emption (`preempt_signal_s`): `--signal=B:USR1@<s>` and `--requeue`. The batch shell traps USR1 and passes it
  to the runner, which passes it to its stage's process group (launchers ignore it; `PreemptionCallback` in the
  training saves a complete checkpoint and exits 0); if the stage's manifest is then missing, the batch script
  requeues its own job
  (`scontrol requeue`; a time-limit kill is never requeued by Slurm itself) and the next start resumes from the
  checkpoint (`resume_from_checkpoint: auto`).
- `wait_for_jobs` follows the jobs to the end with a progress line per state change and returns the failed stage
  (and the log to read), or None.
"""

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from instella_recipes.core import (
    MANIFEST,
    RecipeError,
    atomic_write_text,
    config_path,
    did_you_mean,
    exit_on_recipe_error,
    parse_assignments,
    parse_recipe,
    setup_logging,
)
from instella_recipes.core.paths import REPO_ROOT as ROOT
from instella_recipes.core.variables import split_assignment
from instella_recipes.evaluation.preflight import stage_gpus

from .graph import SLURM_KEYS, Pipeline, PipelineStage, load_pipeline
from .runner import StageFailed, check_inputs, plan, read_record, run_stage, stage_status

ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
          "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED"}  # fmt: skip
DEFAULTS = {"nodes": 1, "ntasks_per_node": 1, "cpus_per_task": 1}
FREE_PORT = "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])"


def asked_cpus(stage: PipelineStage) -> dict:
    """`{"cpus_per_task": n}` when the stage's own settings ask for n worker processes (`num_proc` in its args, else
    in its recipe, as the prepare stages do), else {}: a stage is given the CPUs its recipe uses by default."""
    args = stage.resolved.args if stage.resolved is not None else []
    if "--executor" in args[:-1] and args[args.index("--executor") + 1] == "slurm":
        return {"cpus_per_task": 1}  # prepare_data's own array does the work; this job plans and waits
    value = args[args.index("--num_proc") + 1] if "--num_proc" in args[:-1] else None
    if value is None and stage.recipe:
        text = stage.resolved.recipe_text if stage.resolved is not None else None
        path = Path(stage.recipe) if Path(stage.recipe).is_file() else ROOT / stage.recipe
        if text is None and path.is_file():
            text = path.read_text()
        recipe = yaml.safe_load(text) if text else None
        value = recipe.get("num_proc") if isinstance(recipe, dict) else None
    try:
        cpus = int(value) if value is not None and not isinstance(value, bool) else 0
    except (TypeError, ValueError):
        cpus = 0
    return {"cpus_per_task": cpus} if cpus > 0 else {}


def resources(pipeline: Pipeline, stage: PipelineStage, overrides: list[str]) -> dict:
    """The stage's Slurm resources: defaults < the CPUs its recipe asks for (`asked_cpus`) < the YAML (top-level
    `slurm:`, then the stage's) < `--slurm` flags (`key=value` for every stage, `stage.key=value` or
    `group.key=value` for one)."""
    out = {**DEFAULTS, **asked_cpus(stage), **stage.slurm}
    explicit_gpus = False
    for item in overrides:
        key, value = split_assignment(item, "--slurm", "[stage.]KEY=VALUE")
        target, _, key = key.rpartition(".")
        if key not in SLURM_KEYS:
            hint = did_you_mean(key, SLURM_KEYS, "keys: " + ", ".join(sorted(SLURM_KEYS)))
            raise RecipeError(f"--slurm {item}: expected [stage.]KEY=VALUE with a known key ({hint})")
        if target and target not in (stage.name, stage.group):
            if not any(target in (s.name, s.group) for s in pipeline.stages):
                raise RecipeError(f"--slurm {item}: no stage named '{target}' in {pipeline.path}")
            continue
        out[key] = value
        explicit_gpus = explicit_gpus or key == "gpus_per_node"
    for key in ("nodes", "ntasks_per_node", "cpus_per_task", "gpus_per_node", "preempt_signal_s"):
        if out.get(key) is not None:
            try:
                out[key] = int(out[key])
            except (TypeError, ValueError):
                raise RecipeError(f"{stage.where}: stage '{stage.name}' slurm.{key} must be a whole number") from None
    gpus = stage_gpus(stage.resolved.argv, stage.resolved.accelerate_config)
    if gpus is not None and "gpus_per_node" not in stage.slurm_own and not explicit_gpus:
        # an evaluation stage asks for the GPUs it uses, not the training stages' default (a CPU pipeline, which
        # asks for none, stays without unless the evaluation runs on several)
        if out.get("gpus_per_node") is not None or gpus > 1:
            out["gpus_per_node"] = gpus
    if out.get("time") is not None and not isinstance(out["time"], str):
        # YAML 1.1 reads 48:00:00 as the integer 172800 (base 60): a Slurm time must be quoted.
        raise RecipeError(f"{stage.where}: stage '{stage.name}' slurm.time must be a quoted string, e.g. \"48:00:00\"")
    return out


def _directives(pipeline: Pipeline, stage: PipelineStage, res: dict, dependencies: list[str]) -> list[str]:
    name = f"{pipeline.output_dir.name}:{stage.name}"
    lines = [
        f"--job-name={name}",
        f"--output={stage.resolved.slurm_log.resolve()}",  # the batch script's own output (start, requeue)
        "--open-mode=append",  # a requeued job appends to the same file
        f"--nodes={res['nodes']}",
        f"--ntasks-per-node={res['ntasks_per_node']}",
        f"--cpus-per-task={res['cpus_per_task']}",
    ]
    for key, flag in (("gpus_per_node", "gpus-per-node"), ("mem", "mem"), ("time", "time"),
                      ("partition", "partition"), ("account", "account")):  # fmt: skip
        if res.get(key) is not None:
            lines.append(f"--{flag}={res[key]}")
    if res.get("preempt_signal_s"):
        lines += [f"--signal=B:USR1@{res['preempt_signal_s']}", "--requeue"]
    if dependencies:
        lines += [f"--dependency=afterok:{':'.join(dependencies)}", "--kill-on-invalid-dep=yes"]
    extra = res.get("sbatch_args") or []
    return lines + (shlex.split(extra) if isinstance(extra, str) else [str(a) for a in extra])


def job_argv(
    pipeline: Pipeline, stage: PipelineStage, variables: list[str], slurm: list[str], force: bool
) -> list[str]:
    # The paths as given, run from the same folder (the batch script cds there): the stage identity (its rendered
    # recipe names the pipeline file) is then the same inside the job as in this process.
    argv = [sys.executable, "-m", "instella_recipes.pipeline.slurm", "job", "--config", str(pipeline.path)]
    argv += ["--output_dir", str(pipeline.output_dir), "--stage", stage.name]
    # one flag per item (`--set a=1 --set b=2`): the recipe parser gathers a repeated list flag (`parse_recipe`)
    argv += [word for v in variables for word in ("--set", v)] + [word for s in slurm for word in ("--slurm", s)]
    return argv + (["--force"] if force else [])


def batch_script(pipeline: Pipeline, stage: PipelineStage, res: dict, dependencies: list[str], job: list[str]) -> str:
    """The sbatch script of one stage (what `--dry_run` prints)."""
    manifest = (stage.resolved.output / MANIFEST).resolve()
    head = "\n".join(f"#SBATCH {line}" for line in _directives(pipeline, stage, res, dependencies))
    return f"""#!/bin/bash
# pipeline {pipeline.path}, stage '{stage.name}' (scripts/pipeline.py --executor slurm)
{head}
set -uo pipefail
cd {shlex.quote(os.getcwd())}
echo "[$(date +%T)] {stage.name}: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, restart ${{SLURM_RESTART_COUNT:-0}}"
# the rendezvous port of a multi-task stage: free now on this node, the first of the job (srun passes it on)
export MASTER_PORT=${{MASTER_PORT:-$({shlex.quote(sys.executable)} -c "{FREE_PORT}")}}
preempted=0
# Pre-emption: pass USR1 on to the runner (which passes it to its stage's process group) and to every step (the
# training saves a checkpoint and exits 0); launchers ignore it (SIG_IGN is inherited; the training installs its own
# handler).
on_usr1() {{
    preempted=1; trap '' USR1
    echo "[$(date +%FT%T)] USR1: asking the stage to checkpoint and stop"
    scancel --signal=USR1 "$SLURM_JOB_ID" 2>/dev/null; kill -USR1 0 2>/dev/null
}}
trap on_usr1 USR1
(trap '' USR1; exec {shlex.join(job)}) &
pid=$!
while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done
if [[ $preempted == 1 && ! -f {shlex.quote(str(manifest))} ]]; then
    echo "[$(date +%FT%T)] pre-empted before the stage finished: requeueing job $SLURM_JOB_ID"
    scontrol requeue "$SLURM_JOB_ID"
    exit 0
fi
echo "[$(date +%FT%T)] stage {stage.name}: exit $rc"
exit $rc
"""


def _run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False, **kwargs)
    except FileNotFoundError:
        raise RecipeError(f"{argv[0]} not found: --executor slurm needs the Slurm client commands") from None


def job_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (state, reason) for the jobs the controller still knows (finished ones for MinJobAge)."""
    if not job_ids:
        return {}
    done = _run(["squeue", "-h", "-t", "all", "-j", ",".join(job_ids), "-o", "%i|%T|%r"])
    states = {}
    for line in done.stdout.splitlines():
        job, state, reason = (line.split("|") + ["", ""])[:3]
        states[job.strip()] = (state.strip(), reason.strip())
    return states


def _read_job(stage: PipelineStage) -> dict | None:
    path = stage.resolved.job_record
    return json.loads(path.read_text()) if path.is_file() else None


def submit(pipeline, stages, variables, slurm, force=False, dry_run=False, say=print) -> dict[str, str]:
    """Submit `stages` (in order); returns stage name -> job id of every stage that has a job in flight."""
    known = {s.name: _read_job(s) for s in pipeline.stages}
    states = job_states([r["job_id"] for r in known.values() if r])
    jobs = {n: r["job_id"] for n, r in known.items() if r and states.get(r["job_id"], ("",))[0] in ACTIVE}
    chosen = {s.name for s in stages}
    # the local run's plan, with the jobs already in flight counted as running inputs
    steps = plan(pipeline, stages, force, in_flight=jobs)
    for index, (stage, status, why) in enumerate(steps, 1):
        tag = f"[{index}/{len(stages)}] {stage.name}"
        if stage.name in jobs:
            say(f"{tag}: already {states[jobs[stage.name]][0].lower()} as job {jobs[stage.name]}, not resubmitted")
            continue
        if why is None:
            say(f"{tag}: complete, skipped ({stage.resolved.output})")
            continue
        for name in stage.inputs:
            source = pipeline.stage(name)
            if name not in jobs and name not in chosen and stage_status(pipeline, source) != "complete":
                raise RecipeError(
                    f"stage '{stage.name}' needs stage '{name}', which is neither complete nor queued: submit it too "
                    f"(--stage {source.group})"
                )
        previous = known.get(stage.name)
        if previous and previous.get("job_id") in states and states[previous["job_id"]][0] not in ACTIVE:
            say(f"{tag}: its last job {previous['job_id']} ended {states[previous['job_id']][0]}; submitting again")
        res = resources(pipeline, stage, slurm)
        deps = [jobs[n] for n in stage.inputs if n in jobs]
        script = batch_script(pipeline, stage, res, deps, job_argv(pipeline, stage, variables, slurm, force))
        if dry_run:
            jobs[stage.name] = f"<{stage.name}>"
            say(f"# ---- {tag}: {status}\n{script}")
            continue
        stage.resolved.slurm_log.parent.mkdir(parents=True, exist_ok=True)
        done = _run(["sbatch", "--parsable"], input=script, cwd=ROOT)
        if done.returncode != 0:
            raise RecipeError(f"sbatch refused stage '{stage.name}': {done.stderr.strip()}")
        job_id = done.stdout.strip().split(";")[0]
        jobs[stage.name] = job_id
        path = stage.resolved.job_record
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"job_id": job_id, "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S"), "dependencies": deps}
        atomic_write_text(path, json.dumps(record, indent=2) + "\n")
        after = f" after {', '.join(n for n in stage.inputs if n in jobs)}" if deps else ""
        say(f"{tag}: submitted job {job_id}{after} (log: {stage.resolved.log})")
    return {n: j for n, j in jobs.items() if n in chosen}


def wait_for_jobs(pipeline: Pipeline, jobs: dict[str, str], poll_s: float = 3.0, say=print) -> str | None:
    """Follow `jobs` (stage -> id) until all ended; print each state change. Returns None when all completed, else
    a message naming the failed stage(s), their logs, and the stages cancelled because of them."""
    last, final, start = {}, {}, time.monotonic()
    while len(final) < len(jobs):
        states = job_states([j for n, j in jobs.items() if n not in final])
        for name, job in jobs.items():
            if name in final:
                continue
            state, reason = states.get(job, ("", ""))
            if not state:  # purged from the controller (MinJobAge): the run record says how it ended
                record = read_record(pipeline.stage(name)) or {}
                state = "COMPLETED" if record.get("status") == "done" else "FAILED"
            if (state, reason) != last.get(name):
                elapsed = time.monotonic() - start
                why = f" ({reason})" if reason and reason != "None" else ""
                say(f"[{elapsed:6.0f}s] {name}: job {job} {state.lower()}{why}")
                last[name] = (state, reason)
            if state not in ACTIVE:
                final[name] = (state, reason)
        if len(final) < len(jobs):
            time.sleep(poll_s)
    failed = [n for n, (s, r) in final.items() if s != "COMPLETED" and "Dependency" not in r]
    cancelled = [n for n, (s, r) in final.items() if s != "COMPLETED" and "Dependency" in r]
    if not failed and not cancelled:
        return None
    lines = []
    for name in failed or cancelled:
        stage = pipeline.stage(name)
        lines.append(
            f"stage '{name}' failed (job {jobs[name]}: {final[name][0]}).\n  log: {stage.resolved.log}\n"
            f"  batch log: {stage.resolved.slurm_log}"
        )
    if failed and cancelled:
        lines.append(f"cancelled because an input failed: {', '.join(cancelled)}")
    return "\n".join(lines)


def srun_launcher(res: dict):
    """For a stage with several tasks: argv (`accelerate launch --config_file C script ...`) -> one `accelerate
    launch` per task under `srun`, with the machine rank, the number of machines and the main process from Slurm.
    On CPU (accelerate's MULTI_CPU launcher starts one process and takes its rank from the environment, as under
    mpirun) the rank and world size come from SLURM_PROCID / SLURM_NTASKS."""
    per_task = max(1, (res.get("gpus_per_node") or 0) // res["ntasks_per_node"])

    def wrap(argv: list[str]) -> list[str]:
        if len(argv) < 4 or argv[1:3] != ["launch", "--config_file"]:
            return argv  # not an accelerate stage: runs once, on the first node
        launch = shlex.join(argv[:4])
        rest = shlex.join(argv[4:])
        script = (
            "trap '' USR1; "  # the launcher ignores pre-emption; the training handles it
            "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
            "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; "
            'head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1); '
            f"exec {launch} --num_machines $SLURM_NTASKS --machine_rank $SLURM_PROCID "
            f"--num_processes $((SLURM_NTASKS * {per_task})) --main_process_ip $head "
            "--main_process_port $MASTER_PORT "
            f"{rest}"
        )
        return ["srun", "--kill-on-bad-exit=1", "--label", "bash", "-c", script]

    return wrap


@dataclass
class SlurmJobArguments:
    """The command line of one stage's job (`job_argv` writes it): the pipeline and output folder as given to
    `scripts/pipeline.py`, the stage, and the same `--set` / `--slurm` / `--force`."""

    output_dir: str = field(metadata={"help": "The pipeline's output_dir."})
    stage: str = field(metadata={"help": "The one stage this job runs."})
    set: list[str] = field(default_factory=list, metadata={"help": "VAR=VALUE overrides of `vars` (repeatable)."})
    slurm: list[str] = field(default_factory=list, metadata={"help": "[stage.]KEY=VALUE resource overrides."})
    force: bool = field(default=False, metadata={"help": "Run the stage even if it is complete (first start only)."})


@exit_on_recipe_error
def run_job(argv: list[str]) -> int:
    """Inside a job: run one stage with the local runner (its inputs must be complete). The arguments are read with
    the project's recipe parser (`parse_recipe`) and `--set` with `parse_assignments`, as `scripts/pipeline.py`
    reads them, so the job resolves the stage exactly as the submission did."""
    (args,) = parse_recipe([SlurmJobArguments], argv, config_help="Pipeline YAML (the stage graph).",
                           config_is_input=True)  # fmt: skip
    path = config_path(argv)
    if path is None:
        raise RecipeError("--config is required: the pipeline YAML")
    setup_logging()
    pipeline = load_pipeline(path, args.output_dir, parse_assignments(args.set))
    stage = pipeline.stage(args.stage)
    check_inputs(pipeline, [stage])
    status = stage_status(pipeline, stage)
    if status == "complete" and not (args.force and os.environ.get("SLURM_RESTART_COUNT", "0") == "0"):
        print(f"stage {stage.name}: complete, nothing to do")
        return 0
    res = resources(pipeline, stage, args.slurm)
    launcher = srun_launcher(res) if res["nodes"] * res["ntasks_per_node"] > 1 else None
    print(f"stage {stage.name}: {status}; running (log: {stage.resolved.log})", flush=True)
    try:
        record = run_stage(pipeline, stage, launcher=launcher)
    except StageFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"stage {stage.name}: done in {record['wall_s']:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["job"]:
        sys.exit("usage: python -m instella_recipes.pipeline.slurm job --config ... --stage ...")
    sys.exit(run_job(sys.argv[2:]))
