"""`dolma tokens` (the authors' tool) with its `random` module seeded, for tests/unit/data/test_dolma_tokens.py.

Run with the Python of dolma's own virtual environment: `python dolma_oracle.py SEED tokens --documents ...`.
dolma 1.1 takes `--seed` but seeds nothing on the tokens path (its writer's `__call__` skips the base class's
`random.seed`, and each worker draws from OS entropy), so two of its runs differ. This wrapper changes nothing of
dolma but the seeds: `random.seed(SEED)` before it shuffles the input paths, and `random.seed(f"{SEED}-{g}")` when
it starts output group g (run it with `--debug true` so the groups run in this process). Those are the seeds
`instella_recipes.data.dolma_tokens` uses, so the two must write the same bytes.
"""

import random
import sys

from dolma.cli.__main__ import main
from dolma.tokenizer.executor import MemMapParallelWriter

_original = MemMapParallelWriter.process_single.__func__


def _seeded_process_single(cls, source_path, destination_path, queue, **kwargs):
    random.seed(f"{SEED}-{int(source_path)}")  # source_path is the group's index, as dolma passes it
    return _original(cls, source_path, destination_path, queue, **kwargs)


if __name__ == "__main__":
    SEED = int(sys.argv.pop(1))
    MemMapParallelWriter.process_single = classmethod(_seeded_process_single)
    random.seed(SEED)
    sys.argv[0] = "dolma"
    sys.exit(main())
