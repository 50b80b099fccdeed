"""The end-to-end half of tests/unit/checkpoint/test_convert.py
(processes, whole runs, oracles); the in-process tests are there.

Training-format (OLMo) <-> Hub-format checkpoints: exact key mapping, bit-exact round trip, streaming CLI."""

import subprocess
import sys

import torch
from safetensors.torch import save_file

from instella_recipes.checkpoint.convert import convert_state_dict
from modeling_instella import InstellaForCausalLM
from tests.unit.checkpoint import test_convert as unit_half  # fixtures and helpers both halves use

model = unit_half.model


ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]


def test_cli_streams_sharded_checkpoint_both_ways(model, tmp_path):
    training = convert_state_dict(model.state_dict(), model.config, to="training")
    (tmp_path / "olmo").mkdir()
    keys = sorted(training)
    save_file({k: training[k] for k in keys[:7]}, str(tmp_path / "olmo" / "part-0.safetensors"))
    save_file({k: training[k] for k in keys[7:]}, str(tmp_path / "olmo" / "part-1.safetensors"))
    model.config.save_pretrained(tmp_path / "cfg")

    def run(*args):
        cmd = [sys.executable, str(ROOT / "scripts" / "convert_checkpoint.py"), *map(str, args)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300)

    hub = tmp_path / "hub"
    out = run("to-hub", "--input", tmp_path / "olmo", "--model_config", tmp_path / "cfg/config.json", "--output", hub,
              "--max_shard_size", "50KB")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert (hub / "model.safetensors.index.json").is_file() and not (tmp_path / "hub.partial").exists()
    loaded = InstellaForCausalLM.from_pretrained(hub).eval()
    ids = torch.randint(2, 512, (1, 9))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)

    out = run("to-training", "--input", hub, "--output", tmp_path / "olmo2")
    assert out.returncode == 0, out.stderr
    from safetensors.torch import load_file

    again = {}
    for f in (tmp_path / "olmo2").glob("*.safetensors"):
        again.update(load_file(f))
    assert again.keys() == training.keys() and all(torch.equal(again[k], training[k]) for k in training)


def test_cli_rejects_wrong_shapes_without_leaving_output(model, tmp_path):
    training = convert_state_dict(model.state_dict(), model.config, to="training")
    training["transformer.blocks.0.att_proj.weight"] = training["transformer.blocks.0.att_proj.weight"][:-8]
    (tmp_path / "olmo").mkdir()
    save_file(training, str(tmp_path / "olmo" / "model.safetensors"))
    model.config.save_pretrained(tmp_path / "olmo")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts/convert_checkpoint.py"), "to-hub", "--input", str(tmp_path / "olmo"),
         "--output", str(tmp_path / "hub")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 2
    assert "att_proj" in out.stderr and "rows" in out.stderr
    assert not (tmp_path / "hub").exists() and not (tmp_path / "hub.partial").exists()
