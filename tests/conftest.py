"""Shared fixtures: the tiny world, a tiny tokenizer and tiny Instella models (hidden 64, 2 layers), and the
published files the repository ships in tests/fixtures/ (the OLMo tokenizer, the 2-layer parity reference)."""

import os
from pathlib import Path

import pytest
import torch

import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)
from instella_recipes.data.tiny_world import TinyWorld, write_tiny_world
from instella_recipes.data.tokenizer import load_tokenizer, train_bpe_tokenizer
from modeling_instella import InstellaConfig, InstellaForCausalLM
from tests.helpers.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture: the run's private Slurm cluster)

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"  # copied from the shared fixtures; both public (see tests/fixtures/README.md)
FIXTURE = FIXTURES / "instella_reference_dev.safetensors"
OLMO_TOKENIZER = FIXTURES / "tokenizers" / "olmo-gpt-neox-20b-pii-special.json"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


@pytest.fixture(autouse=True, scope="session")
def token_check_cache(tmp_path_factory):
    """The token-file check cache (`data/integrity.py`) of this test session, not the user's ~/.cache; subprocesses
    inherit it."""
    os.environ["INSTELLA_CACHE_DIR"] = str(tmp_path_factory.mktemp("instella_cache"))
    yield


def tiny_config(**overrides) -> InstellaConfig:
    """A 2-layer, hidden-64 Instella config (what every CPU test trains)."""
    values = dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256,
    )  # fmt: skip
    values.update(overrides)
    return InstellaConfig(**values)


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one intra-op thread: their matrices are too small for a second one to pay."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def reference_fixture():
    return FIXTURE


@pytest.fixture(scope="session")
def olmo_tokenizer():
    return load_tokenizer(OLMO_TOKENIZER)


@pytest.fixture(scope="session")
def tiny_world_files(tmp_path_factory):
    return write_tiny_world(tmp_path_factory.mktemp("tiny_world"), TinyWorld())


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A 512-id byte-level BPE trained on the tiny world, with the OLMo special-token layout."""
    texts = [row["text"] for row in TinyWorld().corpus()]
    return train_bpe_tokenizer(texts, vocab_size=512)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer):
    """A saved tiny Instella (seeded random weights) plus its tokenizer: a stand-in for a Hub checkpoint."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_instella")
    InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer))).save_pretrained(folder)
    tiny_tokenizer.save_pretrained(folder)
    return folder
