"""Token files are read in the authors' order, checked against the authors' implementation (ai2-olmo from PyPI, the
same `MemMapDataset` + `IterableDataset` as Instella's fork; see tests/helpers/olmo_oracle.py), never against our
reading of it: on 4 files of odd lengths (remainders dropped, 47 instances, 5 global batches of 8, 7 instances
dropped), every rank's instances at every micro-step equal the authors' rank's, for 1, 2 and 4 ranks, from the start
and resumed at a mid-epoch step, in the next epoch, and with dataloader workers on either side.

- in-process: our `TokenFiles` + `OLMoOrderSampler` in the Trainer's DataLoader, wrapped by accelerate's own
  `prepare_data_loader` for each rank (the sharding `Trainer.get_train_dataloader` gets) and its
  `skip_first_batches` (the Trainer's resume);
- end to end (slow): `scripts/pretrain.py` on 2 gloo processes, then its mid-epoch checkpoint resumed on 4
  processes and on 1, recording every forward's input_ids.
"""

import numpy as np
import pytest
import torch
from accelerate.data_loader import prepare_data_loader, skip_first_batches
from torch.utils.data import DataLoader
from transformers import TrainerState

from instella_recipes.data.token_files import OLMoOrderSampler, TokenFiles, olmo_permutation
from instella_recipes.pretraining.pretrain_trainer import SamplerEpoch
from tests.helpers.token_file_utils import SEQ_LEN, write_token_files

SEED, GLOBAL = 6198, 8


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_token_files(tmp_path_factory.mktemp("token_files"))


def test_accelerates_set_epoch_misses_the_sampler_of_a_resumed_multi_process_loader(files):
    """Why `SamplerEpoch` exists: after `skip_first_batches` on 2 processes, `set_epoch(1)` stops short of it."""
    dataset = TokenFiles(files, SEQ_LEN)
    sampler = OLMoOrderSampler(len(dataset), GLOBAL, 2, 2, SEED)
    loader = DataLoader(dataset, batch_size=2, sampler=sampler, collate_fn=TokenFiles.collate)
    loader = skip_first_batches(prepare_data_loader(loader, num_processes=2, process_index=0), 2)
    loader.set_epoch(1)
    assert sampler.epoch == 0
    SamplerEpoch(sampler).on_epoch_begin(None, TrainerState(global_step=sampler.steps + 1), None)
    assert sampler.epoch == 1


def test_the_order_is_the_numpy_pcg64_permutation_of_file_order_instances(files):
    """What the oracle agrees with, spelled out: instance i is the i-th seq_len slice over the files in path order."""
    dataset = TokenFiles(files, SEQ_LEN)
    assert [int(n) for n in dataset.starts] == [0, 13, 37, 45, 47] and len(dataset) == 47
    raw = [torch.from_numpy(np.fromfile(p, dtype="<u2").astype(np.int64)) for p in files]
    assert torch.equal(dataset[14]["input_ids"], raw[1][16:32]) and torch.equal(dataset[46]["labels"], raw[3][16:32])
    order = olmo_permutation(47, SEED)
    sampler = OLMoOrderSampler(47, GLOBAL, 2, 2, SEED)
    assert sampler.steps == 5 and list(sampler.global_order()) == list(order[:40])
    first = list(sampler)[:4]  # rank 0's micro-batch 0, then rank 1's
    assert first == [int(order[0]), int(order[2]), int(order[1]), int(order[3])]
