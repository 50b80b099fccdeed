"""The authors' data order as a test-only oracle: AllenAI's `ai2-olmo` from PyPI, run in its own process.

Instella's loader (`instella/data/memmap_dataset.py`, `iterable_dataset.py`, `__init__.py` at f00a236) is OLMo's with
the package renamed; ai2-olmo 0.6.0 has the same `MemMapDataset` and `IterableDataset` except that it seeds
`PCG64(seed + epoch)` where the fork seeds `PCG64(seed)` after `build_train_dataloader` added the epoch to the seed
(and `reshuffle` adds one per epoch): the same permutation for every epoch. Nothing of it is copied here: the wheel
is unpacked from its PyPI wheel into a per-user cache (`oracles.py`) and imported in a subprocess
(`python olmo_oracle.py <target>` with a JSON spec on stdin), where its cloud and config dependencies
(boto3, google-cloud, cached_path, omegaconf; used only for remote paths and YAML configs) are import-time
stand-ins, so that nothing leaks into the test process.

The oracle builds the authors' train dataloader as `build_train_dataloader` does (their `DataCollator`,
`batch_size = global / world`, `drop_last`, `start_index = step x global`, DataLoader workers or their default
threads) and splits each device batch into micro-batches as `Trainer.split_batch` does (`tensor.split(micro)`).
"""

import importlib
import importlib.abc
import importlib.machinery
import json
import os
import subprocess
import sys
import types
from pathlib import Path

AI2_OLMO = ("ai2-olmo", "0.6.0")
STAND_INS = {"boto3", "botocore", "cached_path", "google", "omegaconf", "importlib_resources"}


def oracle_target(request) -> Path:
    """For a session fixture: the unpacked ai2-olmo wheel (`oracles.py`: fetched once per host into a per-user
    cache), or a skip saying PyPI could not be reached (`ai2_olmo = pytest.fixture(scope="session",
    name="ai2_olmo")(oracle_target)`)."""
    from tests.helpers.oracles import (
        unpacked_wheel,  # here: this file also runs as the oracle's own script, outside tests/
    )

    target = unpacked_wheel(*AI2_OLMO)
    assert (target / "olmo" / "data" / "iterable_dataset.py").is_file(), f"{target} holds no olmo/data/"
    return target


def run_oracle(target: Path, specs: list[dict]) -> list:
    """The oracle's answer for each spec (see `_micro_batches`), from one subprocess."""
    done = subprocess.run(
        [sys.executable, __file__, str(target)], input=json.dumps(specs), capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"the ai2-olmo oracle failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


# --- below runs in the oracle's own process -----------------------------------------------------------------------
class _StandInMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return ()  # class attributes read at import (e.g. `SchemeClient.recoverable_errors + (...)`)


class _StandIn(metaclass=_StandInMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _StandIn()

    def __getattr__(self, name):
        return _StandIn()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on `sys.meta_path`: a module that is really installed is imported as usual."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)

        def attribute(name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _StandIn

        module.__getattr__ = attribute
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def _import_olmo_data(target: Path):
    import torch  # noqa: F401  (imported first, with the real environment)

    sys.meta_path.append(_StandInFinder())
    sys.path.insert(0, str(target))
    # The packages' __init__ files import the model and config stacks; the data modules need neither.
    for name, folder in (("olmo", target / "olmo"), ("olmo.data", target / "olmo" / "data")):
        package = types.ModuleType(name)
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    memmap = importlib.import_module("olmo.data.memmap_dataset")
    iterable = importlib.import_module("olmo.data.iterable_dataset")
    collator = importlib.import_module("olmo.data.collator")
    return memmap.MemMapDataset, iterable.IterableDataset, collator.DataCollator


def _micro_batches(olmo, spec: dict) -> list:
    """[rank][step][micro-batch] -> list of instances (token id lists), from `start_step` for `steps` steps."""
    from torch.utils.data import DataLoader

    memmap_dataset, iterable_dataset, data_collator = olmo
    dataset = memmap_dataset(*spec["paths"], chunk_size=spec["seq_len"], include_instance_metadata=False)
    world, global_batch, micro = spec["world"], spec["global_batch"], spec["micro"]
    out = []
    for rank in range(world):
        loader = DataLoader(
            iterable_dataset(
                dataset, global_batch, seed=spec["seed"], epoch=spec.get("epoch", 0), drop_last=True,
                start_index=spec.get("start_step", 0) * global_batch, world_size=world, rank=rank, fs_local_rank=0,
            ),
            batch_size=global_batch // world, drop_last=True, num_workers=spec.get("workers", 0),
            collate_fn=data_collator(pad_direction="right", pad_token_id=1),
        )  # fmt: skip
        steps = []
        for batch in loader:
            steps.append([m.tolist() for m in batch["input_ids"].split(micro, dim=0)])
            if spec.get("steps") is not None and len(steps) == spec["steps"]:
                break
        out.append(steps)
    return out


def main(target: str) -> None:
    olmo = _import_olmo_data(Path(target))
    specs = json.loads(sys.stdin.read())
    json.dump([_micro_batches(olmo, spec) for spec in specs], sys.stdout)
    sys.stdout.flush()
    # The authors' loader keeps prefetch threads running when we stop after `steps` batches; tearing the interpreter
    # down under them can abort in C++ ("terminate called without an active exception", seen once in CI) after the
    # answer is complete. The answer is written and flushed: leave without the teardown.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
