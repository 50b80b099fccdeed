"""The end-to-end half of tests/unit/data/test_token_files_order.py (what is compared and why: its docstring):
`scripts/pretrain.py` on 2 gloo processes, then its mid-epoch checkpoint resumed on 4 processes and on 1, recording
every forward's input_ids, against the authors' implementation (tests/helpers/olmo_oracle.py).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from torch.utils.data import DataLoader
from transformers import TrainerState

from instella_recipes.data.token_files import OLMoOrderSampler, TokenFiles
from instella_recipes.pretraining.pretrain_trainer import SamplerEpoch
from tests.helpers.olmo_oracle import oracle_target, run_oracle
from tests.helpers.token_file_utils import SEQ_LEN, recorded_steps, token_argv
from tests.unit.data import test_token_files_order as unit_half  # fixtures and helpers both halves use

GLOBAL, SEED, files = unit_half.GLOBAL, unit_half.SEED, unit_half.files


ROOT = Path(__file__).resolve().parents[2]


ai2_olmo = pytest.fixture(scope="session", name="ai2_olmo")(oracle_target)


# (world, per-device micro-batch, start step, epoch, our DataLoader workers, the authors' DataLoader workers)
CASES = [
    (1, 4, 0, 0, 0, 0),
    (1, 4, 3, 0, 0, 0),
    (2, 2, 0, 0, 2, 0),
    (2, 2, 2, 0, 0, 2),
    (2, 4, 1, 0, 0, 0),
    (2, 2, 0, 1, 0, 0),
    (2, 2, 1, 1, 0, 0),
    (4, 1, 0, 0, 0, 0),
    (4, 1, 2, 0, 0, 0),
]


@pytest.fixture(scope="module")
def authors(ai2_olmo, files):
    specs = [
        {"paths": [str(p) for p in files], "seq_len": SEQ_LEN, "global_batch": GLOBAL, "seed": SEED, "world": world,
         "micro": micro, "start_step": start, "epoch": epoch, "workers": theirs, "steps": None}
        for world, micro, start, epoch, _, theirs in CASES
    ]  # fmt: skip
    return dict(zip(CASES, run_oracle(ai2_olmo, specs)))


def ours(files, world, micro, start, epoch, workers) -> list:
    """[rank][step][micro-batch] through the Trainer's dataloader as accelerate prepares it for each rank, with what
    the Trainer does at an epoch's start (`SamplerEpoch.on_epoch_begin`, then the dataloader's `set_epoch`)."""
    dataset = TokenFiles(files, SEQ_LEN)
    accumulation = GLOBAL // (micro * world)
    out = []
    for rank in range(world):
        sampler = OLMoOrderSampler(len(dataset), GLOBAL, micro, world, SEED)
        loader = DataLoader(dataset, batch_size=micro, sampler=sampler, collate_fn=TokenFiles.collate,
                            num_workers=workers, drop_last=True)  # fmt: skip
        loader = prepare_data_loader(loader, num_processes=world, process_index=rank, put_on_device=False)
        if start:
            loader = skip_first_batches(loader, start * accumulation)
        state = TrainerState(global_step=epoch * sampler.steps + start)
        SamplerEpoch(sampler).on_epoch_begin(None, state, None)
        loader.set_epoch(epoch)
        batches = [batch["input_ids"].tolist() for batch in loader]
        out.append([batches[i : i + accumulation] for i in range(0, len(batches), accumulation)])
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"world{c[0]}-micro{c[1]}-start{c[2]}-epoch{c[3]}-w{c[4]}{c[5]}")
def test_every_rank_gets_the_authors_instances_at_every_micro_step(files, authors, case):
    world, micro, start, epoch, workers, _ = case
    expected = authors[case]
    assert len(expected) == world and len(expected[0]) == 5 - start  # 47 instances -> 5 whole global batches
    assert ours(files, world, micro, start, epoch, workers) == expected


def _run(cmd):
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop("RANK", None)
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def _launch(processes: int, argv: list[str]):
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes)]
    done = _run([*launch, "scripts/pretrain.py", *argv])
    errors = [line for line in done.stderr.splitlines() if "error" in line.lower()][:5]
    assert done.returncode == 0, "\n".join(errors) + done.stderr[-2000:]


@pytest.mark.slow
def test_pretrain_feeds_each_rank_the_authors_instances_and_resumes_on_other_world_sizes(
    ai2_olmo, files, tmp_path, tiny_tokenizer
):
    import json
    import shutil

    from instella_recipes.pretraining.pretrain import main

    tokenizer = tmp_path / "tokenizer"
    tiny_tokenizer.save_pretrained(tokenizer)
    listing = tmp_path / "paths.txt"
    listing.write_text("".join(f"{p.name}\n" for p in files))
    plugin = ["--plugins", "tests.helpers.token_file_utils:record_inputs", "--data_root", str(files[0].parent)]

    def argv(out, world, micro, **kw):
        args = token_argv(listing, tokenizer, out, max_steps=4, save_steps=2, global_batch_size=GLOBAL,
                          per_device_train_batch_size=micro, gradient_accumulation_steps=GLOBAL // (micro * world),
                          **kw)  # fmt: skip
        return [*args, *plugin]

    two = tmp_path / "two"
    _launch(2, argv(two, 2, 2, dataloader_num_workers=1))
    specs = [
        {"paths": [str(p) for p in files], "seq_len": SEQ_LEN, "global_batch": GLOBAL, "seed": SEED, "world": world,
         "micro": micro, "start_step": start, "steps": 4 - start}
        for world, micro, start in ((2, 2, 0), (4, 1, 2), (1, 4, 2))
    ]  # fmt: skip
    from_start, resumed_four, resumed_one = run_oracle(ai2_olmo, specs)
    assert recorded_steps(two, 2, 2) == from_start

    for name, world, micro in (("four", 4, 1), ("one", 1, 4)):
        run = tmp_path / name
        run.mkdir()
        shutil.copytree(two / "checkpoint-2", run / "checkpoint-2")
        shutil.copy(two / "run.json", run / "run.json")
        if world > 1:
            _launch(world, argv(run, world, micro))
        else:
            assert main(argv(run, world, micro)) == 0
        expected = resumed_four if world == 4 else resumed_one
        assert recorded_steps(run, world, GLOBAL // (micro * world)) == expected
        assert json.loads((run / "manifest.json").read_text())["global_step"] == 4
