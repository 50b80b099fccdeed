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


def worker_group(nodeid: str) -> str:
    """The worker group of a test under `pytest -n N --dist loadscope` (`make test`): its module, so that a module's
    fixtures (a prepared folder, the runs its tests read) are built once; the Slurm modules (tests/e2e/*slurm*.py,
    whose tests use the private cluster `slurm_cluster`) share one group, so the run starts one cluster, as without
    xdist. That group goes first: it is the longest (its jobs run a whole tiny pipeline), so started last it would end
    the run alone."""
    module = nodeid.split("::")[0]
    return "slurm" if module.startswith("tests/e2e/") and "slurm" in Path(module).name else module


def pytest_collection_modifyitems(config, items):
    """A test on the private Slurm cluster lives in a tests/e2e file named *slurm* (`worker_group`)."""
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()) and worker_group(item.nodeid) != "slurm":
            raise pytest.UsageError(f"{item.nodeid} uses slurm_cluster: move it to a tests/e2e/*slurm*.py file")


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist's loadscope scheduler, grouped by `worker_group` (xdist's loadgroup marks do not reach
    pytest 9's node ids), the Slurm group first and the rest in collection order (the unit tier first)."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_group(nodeid)

        def _assign_work_unit(self, node) -> None:
            if "slurm" in self.workqueue:  # an OrderedDict of the groups not yet sent
                self.workqueue.move_to_end("slurm", last=False)
            super()._assign_work_unit(node)

    config.option.loadscopereorder = False  # collection order, not the most-parametrized module first
    return ModuleScheduling(config, log)


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
