"""scripts/merge.py: the merge of three seeds is the element-wise mean (and a weighted mean), loads with
from_pretrained, and mismatched inputs are refused."""

import json
import shutil

import pytest
import torch
from instella_recipes.scripts.merge import main
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, tiny_tokenizer):
    folders = []
    for seed in (5796, 6198, 8915):
        torch.manual_seed(seed)
        folder = tmp_path_factory.mktemp(f"seed{seed}")
        InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer))).save_pretrained(folder)
        tiny_tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


def test_merge_of_three_seeds_is_the_elementwise_mean(seeds, tmp_path):
    out = tmp_path / "merged"
    assert main(["--inputs", *map(str, seeds), "--output_dir", str(out)]) == 0
    states = [load_file(f / "model.safetensors") for f in seeds]
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(states[0])
    for key, value in merged.items():
        torch.testing.assert_close(value, (states[0][key] + states[1][key] + states[2][key]) / 3, rtol=0, atol=1e-7)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    torch.testing.assert_close(model.state_dict()["lm_head.weight"], merged["lm_head.weight"])
    assert (out / "tokenizer.json").is_file() and (out / "modeling_instella.py").is_file()
    assert json.loads((out / "manifest.json").read_text())["stage"] == "merge"

    weighted = tmp_path / "weighted"
    assert main(["--inputs", *map(str, seeds), "--output_dir", str(weighted), "--weights", "2", "1", "1"]) == 0
    w = load_file(weighted / "model.safetensors")["model.norm.weight"]
    expected = (
        2 * states[0]["model.norm.weight"] + states[1]["model.norm.weight"] + states[2]["model.norm.weight"]
    ) / 4
    torch.testing.assert_close(w, expected)


def test_mismatched_inputs_are_refused(seeds, tmp_path, capsys, tiny_tokenizer):
    other = tmp_path / "other"
    InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer), num_hidden_layers=1)).save_pretrained(other)
    with pytest.raises(SystemExit) as exc:
        main(["--inputs", str(seeds[0]), str(other), "--output_dir", str(tmp_path / "o1")])
    assert exc.value.code == 2 and "different config" in capsys.readouterr().err

    missing_key = tmp_path / "missing_key"
    shutil.copytree(seeds[1], missing_key)
    state = load_file(missing_key / "model.safetensors")
    state.pop("model.norm.weight")
    save_file(state, missing_key / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(SystemExit):
        main(["--inputs", str(seeds[0]), str(missing_key), "--output_dir", str(tmp_path / "o2")])
    assert "hold different tensors" in capsys.readouterr().err
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
