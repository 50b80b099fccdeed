"""Writing a destination's groups (`dolma_tokens.write_group`, one `part-{g}` each) into its partial folder, in this
process or in `num_proc` forked worker processes, each group recorded in `.done/{g}.json` once complete.

Why fork (measured with benchmarks/bench_token_tasks.py, 2.3M tokens, 4 groups, the 2-core VM): from a forkserver,
`num_proc 2` cost twice the CPU of `num_proc 1` (20.2 vs 10.3 CPU s) and 1.4x its wall time. Each forkserver child
runs multiprocessing's main-module fix-up, which imports `scripts/prepare_data.py` again, and with it torch, datasets
and transformers: about 2.5 CPU s per worker before its first token (per-worker `os.times()`), more than a group of
575K tokens costs to write. Forked workers inherit the imports and start at once.
"""

import json
import multiprocessing
import os
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from instella_recipes.core import atomic_write_text
from instella_recipes.data import dolma_tokens

STATE = ".progress.json"  # in the partial folder: the inputs it is being built from
DONE = ".done"  # in the partial folder: one record per finished group

_WORKER: dict = {}


def done_groups(work: Path) -> set[int]:
    """The groups of a partial destination folder recorded as completely written."""
    return {int(p.stem) for p in (work / DONE).glob("*.json")}


def _init_worker(tokenizer_json: str, queue) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: num_proc workers share the node
    _WORKER["tokenizer"] = Tokenizer.from_str(tokenizer_json)
    _WORKER["queue"] = queue


def _run_group(group, paths, stem, eos_id, dtype, settings, sample) -> tuple[int, dict]:
    queue = _WORKER["queue"]
    result = dolma_tokens.write_group(
        group, paths, Path(stem), _WORKER["tokenizer"], eos_id, np.dtype(dtype), settings, queue.put, sample
    )
    return group, result


def worker_context():
    """`fork`: the workers start as copies of this process, with every module already imported (see the module
    docstring for what forkserver cost). Safe here: this process has not run the tokenizer's thread pool before the
    workers start (it only loaded the tokenizer), tokenizers disables that pool in a forked child anyway, and the
    workers use no torch."""
    return multiprocessing.get_context("fork")


def write_groups(work: Path, groups: list[list[str]], todo: list[int], tok, eos_id, dtype, settings, num_proc,
                 sample=None, on_done=None) -> None:  # fmt: skip
    """Write the groups `todo` of `groups` into `work` (stale files of a group cut short are removed first); record
    each one in `work/.done/` as it finishes, then call `on_done(group, result)` if given."""
    done_dir = work / DONE
    num = len(groups)

    def record(group: int, result: dict) -> None:
        atomic_write_text(done_dir / f"{group}.json", json.dumps(result) + "\n")
        if on_done is not None:
            on_done(group, result)

    stems = {g: str(work / dolma_tokens.part_prefix(g, num)) for g in todo}
    for g in todo:  # leftovers of a group that was cut short (a group is written by one process only)
        for stale in work.glob(f"{dolma_tokens.part_prefix(g, num)}-*"):
            stale.unlink()
    with tqdm(desc=f"tokenizing {work.name.removesuffix('.partial')}", unit="doc", unit_scale=True) as bar:
        if num_proc <= 1 or len(todo) <= 1:
            for g in todo:
                result = dolma_tokens.write_group(
                    g, groups[g], Path(stems[g]), tok, eos_id, dtype, settings, bar.update, sample
                )
                record(g, result)
            return
        ctx = worker_context()
        queue = ctx.SimpleQueue()  # progress counts (passed to the workers as they start; no manager process)
        with ProcessPoolExecutor(
            min(num_proc, len(todo)), mp_context=ctx, initializer=_init_worker, initargs=(tok.to_str(), queue)
        ) as pool:
            pending = {
                pool.submit(_run_group, g, groups[g], stems[g], eos_id, dtype.str, settings, sample) for g in todo
            }
            while pending:
                finished, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
                while not queue.empty():
                    bar.update(queue.get())
                for future in finished:
                    if future.exception() is not None:  # a worker's RecipeError: stop the groups not started
                        pool.shutdown(wait=True, cancel_futures=True)
                    record(*future.result())
            while not queue.empty():
                bar.update(queue.get())
