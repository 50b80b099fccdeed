"""Checkpoint reshaping: FSDP2 (gloo, CPU) DCP checkpoint written by 4 processes -> 2 -> 1 -> HF folder, every
model and optimizer tensor equal to the original; mismatching checkpoints are clear errors."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

from instella_recipes.checkpoint.reshape import main as reshape_main
from instella_recipes.checkpoint.reshape import read_metadata, writer_count

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """{n4, m2, reference, config}: the 4-writer FSDP2 checkpoint and its 2-writer reshape (one torchrun)."""
    tmp = tmp_path_factory.mktemp("dcp")
    paths = {"n4": tmp / "n4", "reference": tmp / "reference.pt", "config": tmp / "config", "m2": tmp / "m2"}
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4",
               str(ROOT / "tests/helpers/dcp_writer.py"), str(paths["n4"]), str(paths["reference"]),
               str(paths["config"]), str(paths["m2"])]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return paths


def assert_equal_to_reference(checkpoint: Path, reference: dict) -> None:
    dcp_to_torch_save(checkpoint, checkpoint.with_suffix(".pt"))  # torch's own converter: nested as saved
    got = torch.load(checkpoint.with_suffix(".pt"), weights_only=False)
    assert got["model"].keys() == reference["model"].keys()
    for name, tensor in reference["model"].items():
        assert torch.equal(got["model"][name], tensor), name
    assert got["optim"]["state"].keys() == reference["optim"]["state"].keys()
    for name, state in reference["optim"]["state"].items():
        assert state.keys() == {"step", "exp_avg", "exp_avg_sq"}
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(got["optim"]["state"][name][key]), torch.as_tensor(value)), (name, key)
    assert got["optim"]["param_groups"] == reference["optim"]["param_groups"]


@pytest.mark.slow
def test_reshape_4_to_2_to_1_and_hf_export_keep_every_tensor(checkpoints, tmp_path):
    reference = torch.load(checkpoints["reference"], weights_only=False)
    m1, hf = tmp_path / "m1", tmp_path / "hf"
    reshape_main(["--input", str(checkpoints["m2"]), "--output", str(m1)])
    for name, writers in (("n4", 4), ("m2", 2)):
        metadata = read_metadata(checkpoints[name])
        assert writer_count(metadata) == writers
        # dim-0 sharded like fully_shard on that many ranks: a [96, 32] embedding is stored in `writers` chunks
        assert len(metadata.state_dict_metadata["model.model.embed_tokens.weight"].chunks) == writers
        assert_equal_to_reference(checkpoints[name], reference)
    # A fresh 2-way fully_shard model + AdamW resumed from the 2-writer checkpoint holds exactly the original state.
    resumed = torch.load(str(checkpoints["reference"]).replace(".pt", "_resumed_m2.pt"), weights_only=False)
    for name, tensor in reference["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name
    for name, state in reference["optim"]["state"].items():
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(resumed["optim"]["state"][name][key]), torch.as_tensor(value))
    assert writer_count(read_metadata(m1)) == 1
    assert_equal_to_reference(m1, reference)

    reshape_main(["--input", str(m1), "--output", str(hf), "--to", "hf", "--model_config", str(checkpoints["config"])])
    assert not (tmp_path / "hf.partial").exists()
    model = AutoModelForCausalLM.from_pretrained(hf)  # strict: every key present with its shape
    state = model.state_dict()
    for name, tensor in reference["model"].items():
        assert torch.equal(state[name], tensor), name


@pytest.mark.slow
def test_mismatching_checkpoint_and_bad_paths_are_clear_errors(checkpoints, tmp_path, capsys):
    from tests.conftest import tiny_config

    wrong = tmp_path / "wrong"
    tiny_config(hidden_size=48, intermediate_size=48, vocab_size=96, num_attention_heads=2).save_pretrained(wrong)
    cases = [
        (["--input", str(checkpoints["m2"]), "--output", str(tmp_path / "x"), "--to", "hf", "--model_config",
          str(wrong)], "shape mismatch"),
        (["--input", str(checkpoints["m2"]), "--output", str(tmp_path / "y"), "--model_config", str(wrong)],
         "checkpoint does not match the instella model"),
        (["--input", str(tmp_path), "--output", str(tmp_path / "z")], "not a torch.distributed.checkpoint directory"),
        (["--input", str(checkpoints["m2"]), "--output", str(checkpoints["n4"])], "already exists"),
        (["--input", str(checkpoints["m2"]), "--output", str(tmp_path / "w"), "--to", "hf"], "needs --model_config"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            reshape_main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert not any(p.name in {"x", "y", "z", "w", "x.partial", "y.partial"} for p in tmp_path.iterdir())
