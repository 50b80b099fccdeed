"""Fixtures several e2e modules share, built once per test session (per worker under `make test`): one tiny prepared
folder and one uninterrupted tiny pretraining run that the pre-emption tests read as their reference."""

import pytest
import torch

from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv


@pytest.fixture(scope="session")
def tiny_pretrain_data(tmp_path_factory):
    """`prepare_tiny` with its defaults (the tiny world, 64-token windows); tests read it and write elsewhere."""
    return prepare_tiny(tmp_path_factory.mktemp("tiny_pretrain_data"))


@pytest.fixture(scope="session")
def tiny_pretrain_reference(tiny_pretrain_data, tmp_path_factory):
    """An uninterrupted run of `pretrain_argv(tiny_pretrain_data, ..., max_steps=8, save_steps=100)` on one thread (as
    the `one_thread` tests that resume runs): what a pre-empted and resumed run of the same command must equal bit
    for bit (losses, weights). Read it, never write into it."""
    from instella_recipes.pretraining.pretrain import main

    out = tmp_path_factory.mktemp("tiny_pretrain_reference") / "run"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(pretrain_argv(tiny_pretrain_data, out, max_steps=8, save_steps=100)) == 0
    finally:
        torch.set_num_threads(threads)
    return out
