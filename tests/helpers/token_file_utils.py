"""Helpers of the token-file tests: OLMo token files of odd lengths, a pretrain command line over them, and a plugin
that records the input_ids of every training forward (one file per rank)."""

import json
from pathlib import Path

import numpy as np

from tests.helpers.pretrain_utils import pretrain_argv

SEQ_LEN = 16
# tokens per file: 13, 24, 8 and 2 instances of 16 (each remainder dropped), 47 in all: 5 global batches of 8
LENGTHS = (211, 397, 130, 45)


def write_token_files(folder: Path, lengths=LENGTHS, vocab: int = 512, seed: int = 0) -> list[Path]:
    """Flat little-endian uint16 files as `dolma tokens` writes them: documents of 3-40 ids, each ending in EOS 0."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, n in enumerate(lengths):
        ids = rng.integers(2, vocab, n).astype("<u2")
        ends = np.cumsum(rng.integers(3, 40, n))
        ids[ends[ends < n]] = 0
        ids[-1] = 0
        path = folder / f"part-{i:02d}-00000.npy"
        ids.tofile(path)
        paths.append(path)
    return paths


def token_argv(paths_file, tokenizer, output_dir, **overrides) -> list[str]:
    """`pretrain_argv` (tiny model, global batch 4, 8 steps) reading token files instead of a data_dir."""
    values = {"data_paths": paths_file, "seq_len": SEQ_LEN, "tokenizer": tokenizer, **overrides}
    argv = pretrain_argv(None, output_dir, **values)
    i = argv.index("--data_dir")
    del argv[i : i + 2]
    return argv


def record_inputs(model, plugin_args: dict) -> list:
    """Plugin: every training forward's input_ids, written to `<output_dir>/recorded_inputs/rank<r>.json` when
    training ends (in the output folder, so a resumed run has the same plugin_args, part of its identity)."""
    from transformers import TrainerCallback

    records = []

    def hook(module, args, kwargs):
        if module.training:
            records.append(kwargs["input_ids"].tolist())

    model.register_forward_pre_hook(hook, with_kwargs=True)

    class Dump(TrainerCallback):
        def on_train_end(self, args, state, control, **kwargs):
            out = Path(args.output_dir) / "recorded_inputs"
            out.mkdir(parents=True, exist_ok=True)
            (out / f"rank{args.process_index}.json").write_text(json.dumps(records))

    return [Dump()]


def recorded_steps(folder: Path, world: int, accumulation: int) -> list:
    """[rank][step][micro-batch] as the recording plugin saw them in the run written to `folder`."""
    out = []
    for rank in range(world):
        micro = json.loads((Path(folder) / "recorded_inputs" / f"rank{rank}.json").read_text())
        out.append([micro[i : i + accumulation] for i in range(0, len(micro), accumulation)])
    return out
