"""One name per concept in every stage: `loss_reduction` (pretraining and SFT; the retired `loss_normalizer` is told
what to write instead), `chat_template_path` (SFT, DPO, GRPO; the retired `template_path` likewise), and the
post-training fields GRPO shares instead of redeclaring them."""

import dataclasses

import pytest

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.post_training.dpo import CheckedDPOConfig
from instella_recipes.post_training.grpo import CheckedGRPOConfig
from instella_recipes.post_training.sft import CheckedSFTConfig
from instella_recipes.post_training.shared import CheckedModelConfig, PostTrainingInputs
from instella_recipes.pretraining.pretrain import PretrainArguments


def test_pretraining_and_sft_name_the_loss_divisor_alike():
    assert {f.name for f in dataclasses.fields(PretrainArguments)} >= {"loss_reduction"}
    assert {f.name for f in dataclasses.fields(CheckedSFTConfig)} >= {"loss_reduction"}
    assert PretrainArguments(output_dir="o").loss_reduction == "input_tokens"  # OLMo's B x seq_len
    with pytest.raises(RecipeError, match=r"loss_reduction must be one of \('input_tokens', 'mean'\), not 'sum'"):
        PretrainArguments(output_dir="o", loss_reduction="sum")


@pytest.mark.parametrize(
    "classes, key, value, hint",
    [
        ([PretrainArguments], "loss_normalizer", "predicted_tokens", r"loss_reduction: mean \(was predicted_tokens"),
        ([CheckedDPOConfig, CheckedModelConfig], "template_path", "t.jinja", "chat_template_path"),
        ([CheckedGRPOConfig, CheckedModelConfig], "template_path", "t.jinja", "chat_template_path"),
    ],
)
def test_a_retired_key_is_told_the_new_one(tmp_path, classes, key, value, hint):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"output_dir: {tmp_path / 'out'}\n{key}: {value}\n")
    with pytest.raises(RecipeError, match=rf"recipe.yaml:2: unknown key '{key}' \(.*{hint}"):
        parse_recipe(classes, ["--config", str(recipe)])


def test_every_post_training_stage_shares_the_post_training_fields():
    shared = {f.name: f for f in dataclasses.fields(PostTrainingInputs)}
    for cls in (CheckedSFTConfig, CheckedDPOConfig, CheckedGRPOConfig):
        assert issubclass(cls, PostTrainingInputs)
        assert "chat_template_path" in {f.name for f in dataclasses.fields(cls)}
    # GRPO declares only its own default for the share of prompts it may drop (VERL drops overlong prompts)
    own = set(vars(CheckedGRPOConfig)["__annotations__"]) & set(shared)
    assert own == {"max_skip_fraction"}


def test_the_chat_template_is_a_jinja_file(tmp_path):
    with pytest.raises(RecipeError, match=r"chat_template_path t.txt: give a jinja template file"):
        CheckedDPOConfig(output_dir=str(tmp_path), chat_template_path="t.txt")
