"""The task side of `prepare_data --layout olmo --executor local|slurm --tasks N` (`task_runs.py` plans and launches
the run): a datatrove `PipelineStep` that writes one task's share of the run's groups with our group writer
(`group_writer.write_groups`, the byte-exact one), and `task_status`.

Group k of the run's list goes to task k mod N; each group is written by exactly one task and named as dolma names
it, so the bytes depend on the groups, never on N. A task first checks what only its node can see: its tokenizer
file is the planned one, its input files are there with their planned sizes, the partial folders are still this
run's; then it writes its groups not yet recorded as done (a task killed mid-group rewrites that group from its
start; the other groups stay). It reports each group on a progress line of its datatrove log and as datatrove stats
(groups, documents and tokens per group, time per group).
"""

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.logging import logger as task_logger
from tokenizers import Tokenizer

from instella_recipes.core import MANIFEST, RecipeError, file_digest
from instella_recipes.data.dolma_tokens import DolmaTokensArguments
from instella_recipes.data.group_writer import STATE, done_groups, write_groups
from instella_recipes.data.sampling import DocumentSample

PLAN = "plan.json"
TOKENIZER = "tokenizer.json"  # beside the plan: the tokenizer the run was planned with, as a string
SLURM_JOBS = "slurm_jobs.json"


def tasks_root(output_dir: str | Path) -> Path:
    """Where the runs' datatrove folders live: beside output_dir, as its `.partial` folders do."""
    return Path(f"{Path(output_dir)}.tasks")


def assigned(items: list, rank: int, world_size: int) -> list:
    """The groups task `rank` of `world_size` writes: every world_size-th of the run's list, from `rank`."""
    return items[rank::world_size]


@dataclass
class _TaskSource:
    name: str
    work: Path
    groups: list[list[str]]
    settings: DolmaTokensArguments
    sample: DocumentSample | None


def _load_tokenizer(plan_file: Path, record: dict) -> Tokenizer:
    """The planned tokenizer; refused when this node's tokenizer file is another one (its bytes would differ)."""
    path, digest = record["tokenizer_file"], record["tokenizer_file_sha256"]
    if path is not None:
        if not os.path.isfile(path):
            raise RecipeError(f"tokenizer {path} is missing on {socket.gethostname()}: give every node the file")
        here = file_digest(path)
        if here != digest:
            raise RecipeError(
                f"tokenizer {path} on {socket.gethostname()} is not the one this run was planned with (sha256 "
                f"{here[:12]} vs {digest[:12]}): give every node the same file, then run again"
            )
    return Tokenizer.from_str((plan_file.parent / TOKENIZER).read_text())


def _task_source(source: dict) -> _TaskSource:
    """A source as a task needs it, checked against this node: the partial folder is this run's, and every input
    file of its groups is here with its planned size."""
    work = Path(source["work"])
    state = work / STATE
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
    return _TaskSource(source["name"], work, source["groups"], DolmaTokensArguments(**source["settings"]), sample)


class TokenGroupsStep(PipelineStep):
    """A datatrove step: task `rank` writes its share of the run's groups (`assigned`) with our group writer,
    `num_proc` worker processes at a time, and reports groups, documents and tokens as datatrove stats."""

    name = "token groups"
    type = "prepare_data"

    def __init__(self, plan_file: str, num_proc: int = 1):
        super().__init__()
        self.plan_file, self.num_proc = plan_file, num_proc

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        plan_file = Path(self.plan_file)
        record = json.loads(plan_file.read_text())
        mine = assigned(record["items"], rank, world_size)
        tok = _load_tokenizer(plan_file, record)
        by_source: dict[int, list[int]] = {}
        for i, g in mine:
            by_source.setdefault(i, []).append(g)
        sources = {i: _task_source(record["sources"][i]) for i in by_source}  # every check before the first group
        dtype, start, written = np.dtype(record["dtype"]), time.monotonic(), 0

        def report(source: _TaskSource, g: int, result: dict) -> None:
            nonlocal written
            tokens = sum(f["tokens"] for f in result["files"])
            self.stat_update("groups")
            self.stat_update("documents", value=sum(f["documents"] for f in result["files"]), unit="group")
            self.stat_update("tokens", value=tokens, unit="group")
            written += 1
            task_logger.info(
                f"task {rank}/{world_size}: {source.name} group {g} done ({written} of {len(mine)} groups of this "
                f"task, {tokens} tokens, {time.monotonic() - start:.0f} s since the task started)"
            )

        for i, groups in by_source.items():  # a source's groups at once: num_proc workers share them
            source = sources[i]
            todo = sorted(set(groups) - done_groups(source.work))
            with self.track_time("source"):
                write_groups(source.work, source.groups, todo, tok, record["eos_id"], dtype, source.settings,
                             self.num_proc, source.sample, lambda g, r, s=source: report(s, g, r))  # fmt: skip
        task_logger.info(f"task {rank}/{world_size}: {len(mine)} groups done ({len(mine) - written} were already)")


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
            if (dest / MANIFEST).is_file() and not work.exists():
                lines.append(f"  {source['name']}: finished ({dest})")
                continue
            written = len(done_groups(work)) if work.is_dir() else 0
            lines.append(f"  {source['name']}: {written} of {len(source['groups'])} groups written")
    manifest = Path(args.output_dir) / MANIFEST
    lines.append(f"{args.output_dir}: {'complete' if manifest.is_file() else 'not complete'}")
    return lines
