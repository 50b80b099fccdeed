"""Bad input to the model class and the recipe parser: clear errors that name the field and the fix."""

import dataclasses
import json

import pytest
import torch
from conftest import tiny_config
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file, save_file

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.training.checks import check_global_batch, check_tokenizer_fits
from modeling_instella import InstellaConfig, InstellaForCausalLM


def test_hidden_size_not_divisible_by_heads():
    with pytest.raises(
        StrictDataclassClassValidationError, match=r"hidden_size \(66\) is not divisible by num_attention_heads \(4\)"
    ):
        InstellaConfig(hidden_size=66, num_attention_heads=4)


def test_heads_not_divisible_by_kv_heads():
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"num_attention_heads \(4\) is not divisible by num_key_value_heads \(3\)",
    ):
        tiny_config(num_key_value_heads=3)


def test_unknown_attention_backend():
    with pytest.raises(ValueError, match="magic_attention"):
        InstellaForCausalLM._from_config(tiny_config(), attn_implementation="magic_attention")


def test_flash_attention_without_flash_attn_names_the_gpu_extra():
    pytest.importorskip("torch")
    try:
        import flash_attn  # noqa: F401

        pytest.skip("flash-attn is installed here")
    except ImportError:
        pass
    with pytest.raises(ImportError, match=r"\[gpu\]"):
        InstellaForCausalLM._from_config(tiny_config(), attn_implementation="flash_attention_2")


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config()).save_pretrained(tmp_path)
    return tmp_path, load_file(tmp_path / "model.safetensors")


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"), "missing_keys"),
        (lambda sd: sd.update({"transformer.blocks.0.att_proj.weight": torch.zeros(3, 3)}), "unexpected_keys"),
        (lambda sd: sd.update({"model.norm.weight": torch.ones(32)}), "mismatched_keys"),
    ],
)
def test_checkpoint_that_does_not_match_is_an_error(saved, edit, field):
    folder, state = saved
    edit(state)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises((ValueError, RuntimeError), match=field.split("_")[0]) as err:
        InstellaForCausalLM.from_pretrained(folder)
    if field != "mismatched_keys":  # transformers itself raises on shape mismatch, with the key and shapes
        assert "convert_checkpoint.py" in str(err.value)


def test_vocab_smaller_than_tokenizer(tiny_tokenizer):
    with pytest.raises(RecipeError, match=r"vocab_size \(100\) is smaller than the tokenizer \(512 ids"):
        check_tokenizer_fits(tiny_config(vocab_size=100), tiny_tokenizer)
    check_tokenizer_fits(tiny_config(vocab_size=512), tiny_tokenizer)


@dataclasses.dataclass
class Args:
    learning_rate: float = 1e-3
    global_batch_size: int = 8


def test_recipe_unknown_key_names_file_and_line(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("# 1 CPU, global batch 8\nlearning_rate: 0.1\nlearning_rat: 0.2\n")
    with pytest.raises(RecipeError, match=r"r.yaml:3: unknown key 'learning_rat' \(did you mean 'learning_rate'\?\)"):
        parse_recipe([Args], ["--config", str(recipe)])


def test_recipe_cli_overrides_yaml(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(json.dumps({"learning_rate": 0.1, "global_batch_size": 4}))
    (args,) = parse_recipe([Args], ["--config", str(recipe), "--learning_rate", "0.5"])
    assert args.learning_rate == 0.5 and args.global_batch_size == 4


def test_recipe_missing_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        parse_recipe([Args], ["--config", str(tmp_path / "nope.yaml")])


def test_global_batch_mismatch_says_how_to_fix():
    check_global_batch(1024, per_device=8, grad_accum=1, world_size=128)
    with pytest.raises(RecipeError, match="set gradient_accumulation_steps=4"):
        check_global_batch(1024, per_device=2, grad_accum=1, world_size=128)
