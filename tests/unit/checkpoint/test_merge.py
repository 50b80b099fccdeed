"""scripts/merge.py: the merge of three seeds is the element-wise mean, bitwise as the authors' `merge_ckpts.py`
computes it (and a weighted mean), loads with from_pretrained, and mismatched inputs are refused."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from instella_recipes.checkpoint.merge import main
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


def _seeds(tmp_path_factory, tokenizer, dtype=torch.float32) -> list:
    folders = []
    for seed in (5796, 6198, 8915):
        torch.manual_seed(seed)
        folder = tmp_path_factory.mktemp(f"seed{seed}")
        InstellaForCausalLM(tiny_config(vocab_size=len(tokenizer))).to(dtype).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        folders.append(folder)
    return folders


@pytest.fixture(scope="module")
def seeds(tmp_path_factory, tiny_tokenizer):
    return _seeds(tmp_path_factory, tiny_tokenizer)


def authors_mean(tensors: list[torch.Tensor]) -> torch.Tensor:
    """`scripts/merge_ckpts.py:41` restated: Python's `sum` over the checkpoints (it starts from the integer 0 and
    adds them in order, each addition in the tensors' dtype), then `/ len(state_dicts)` (an integer), same dtype."""
    total = 0
    for tensor in tensors:
        total = total + tensor
    return total / len(tensors)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_merge_is_bitwise_the_authors_arithmetic(tmp_path_factory, tiny_tokenizer, tmp_path, dtype):
    folders = _seeds(tmp_path_factory, tiny_tokenizer, dtype)
    out = tmp_path / "merged"
    assert main(["--inputs", *map(str, folders), "--output_dir", str(out)]) == 0
    states = [load_file(f / "model.safetensors") for f in folders]
    merged = load_file(out / "model.safetensors")
    fp32_way = 0  # elements where the fp32-accumulated weighted mean (our earlier way) agrees bitwise
    for key, value in merged.items():
        expected = authors_mean([state[key] for state in states])
        assert value.dtype == dtype and torch.equal(_bits(value), _bits(expected)), key
        other = sum(state[key].float() * (1 / 3) for state in states).to(dtype)
        fp32_way += int((_bits(other) == _bits(expected)).sum())
    if dtype == torch.bfloat16:  # the order and dtype matter: the fp32 way differs on many bf16 elements
        assert fp32_way < 0.9 * sum(v.numel() for v in merged.values())


def test_merge_of_three_seeds_is_the_elementwise_mean(seeds, tmp_path):
    out = tmp_path / "merged"
    assert main(["--inputs", *map(str, seeds), "--output_dir", str(out)]) == 0
    states = [load_file(f / "model.safetensors") for f in seeds]
    merged = load_file(out / "model.safetensors")
    assert set(merged) == set(states[0])
    for key, value in merged.items():
        assert torch.equal(value, (states[0][key] + states[1][key] + states[2][key]) / 3)
    model = AutoModelForCausalLM.from_pretrained(out, trust_remote_code=True)
    torch.testing.assert_close(model.state_dict()["lm_head.weight"], merged["lm_head.weight"])
    assert (out / "tokenizer.json").is_file() and (out / "modeling_instella.py").is_file()
    assert json.loads((out / "manifest.json").read_text())["stage"] == "merge"

    equal = tmp_path / "equal_weights"  # equal weights are the uniform mean
    assert main(["--inputs", *map(str, seeds), "--output_dir", str(equal), "--weights", "1", "1", "1"]) == 0
    assert load_file(equal / "model.safetensors")["lm_head.weight"].equal(merged["lm_head.weight"])
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


def test_a_float32_and_a_bfloat16_input_need_dtype(seeds, tmp_path, capsys):
    """Issue 32: mixed dtypes are refused (the output's dtype would be a guess); with --dtype the mean is taken in
    float32 and written in that dtype."""
    bf16 = tmp_path / "bf16"
    shutil.copytree(seeds[1], bf16)
    state = {k: v.to(torch.bfloat16) for k, v in load_file(bf16 / "model.safetensors").items()}
    save_file(state, str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(SystemExit) as exc:
        main(["--inputs", str(seeds[0]), str(bf16), "--output_dir", str(tmp_path / "o")])
    assert exc.value.code == 2 and "pass --dtype float32 or --dtype bfloat16" in capsys.readouterr().err
    out = tmp_path / "merged"
    assert main(["--inputs", str(seeds[0]), str(bf16), "--output_dir", str(out), "--dtype", "bfloat16"]) == 0
    merged, first = load_file(out / "model.safetensors"), load_file(seeds[0] / "model.safetensors")
    key = "model.norm.weight"
    expected = ((first[key] + state[key].float()) / 2).to(torch.bfloat16)
    assert merged[key].dtype == torch.bfloat16 and torch.equal(merged[key], expected)
