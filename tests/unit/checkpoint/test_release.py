"""`scripts/release.py`: a stage output becomes a Hub-ready folder (shards + index, auto_map + modeling file, tokenizer
with chat template, generation config, model card with the eval table) that reloads with trust_remote_code in a
process that never imports this project."""

import json
from pathlib import Path

import pytest
import yaml

from instella_recipes.checkpoint.release import base_model, main
from instella_recipes.core import write_manifest
from modeling_instella import InstellaForCausalLM

LMEVAL_RESULTS = {
    "results": {
        "tiny_world_mc": {"alias": "tiny_world_mc", "sample_len": 24, "acc,none": 0.625, "acc_stderr,none": 0.1},
        "tiny_world_arithmetic": {"exact_match,strict-match": 0.25, "exact_match_stderr,strict-match": "N/A"},
        "tiny_world": {"alias": "tiny_world", "name": "tiny_world"},
    },
    "n-shot": {"tiny_world_mc": 0, "tiny_world_arithmetic": 0},
}


@pytest.fixture
def stage_output(tmp_path, tiny_model_dir):
    """A tiny checkpoint dressed as a pipeline stage output: a recipe and a manifest naming it and its input."""
    model_dir = tmp_path / "sft"
    model = InstellaForCausalLM.from_pretrained(tiny_model_dir)
    model.save_pretrained(model_dir)
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(model_dir)
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(
        "# CPU, global batch 8: tiny SFT\nlearning_rate: 1.0e-4\nlr_scheduler_type: linear\nnum_train_epochs: 2\n"
        "dataset_mixture: {datasets: [{path: runs/demo/data/sft.jsonl, weight: 1.0}]}\nseed: 42\n"
    )
    write_manifest(model_dir, "sft", recipe=str(recipe), model_name_or_path=str(tiny_model_dir))
    results = tmp_path / "eval_sft" / "model"
    results.mkdir(parents=True)
    (results / "results_2026-01-01T00-00-00.json").write_text(json.dumps(LMEVAL_RESULTS))
    return model_dir, recipe, tmp_path / "eval_sft"


def test_release_bad_input_is_a_clear_error(tmp_path, capsys, stage_output):
    model_dir, _, _ = stage_output
    with pytest.raises(SystemExit, match="2"):
        main(["--model_dir", str(tmp_path / "nothing"), "--output_dir", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert "model_dir" in err and "does not exist" in err
    (tmp_path / "taken").mkdir()
    with pytest.raises(SystemExit, match="2"):
        main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "taken")])
    assert "exists; choose another folder or pass --overwrite" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="2"):
        main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "y"), "--push_to_hub"])
    assert "--push_to_hub needs --repo_id" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_card_shows_the_hyperparameters_the_run_resolved_not_the_recipe_file(stage_output, tmp_path):
    """A run overrode the recipe on the command line (`--learning_rate 1e-2`, LoRA on): the card says what ran."""
    model_dir, recipe, _ = stage_output
    arguments = {"script": {"max_length": 80}, "training": {"learning_rate": 0.01, "seed": 42, "num_train_epochs": 2}}
    lora = {"r": 8, "alpha": 16, "dropout": 0.05, "target_modules": ["q_proj", "v_proj"], "merged": True}
    write_manifest(model_dir, "sft", recipe=str(recipe), arguments=arguments, lora=lora)
    main(["--model_dir", str(model_dir), "--output_dir", str(tmp_path / "rel")])
    card = (tmp_path / "rel" / "README.md").read_text()
    hyper = yaml.safe_load(card.split("## Hyperparameters")[1].split("```yaml")[1].split("```")[0])
    assert hyper == {"learning_rate": 0.01, "num_train_epochs": 2, "max_length": 80, "seed": 42}
    assert "recipe + overrides" in card and "learning_rate: 0.0001" not in card
    assert yaml.safe_load(card.split("## LoRA")[1].split("```yaml")[1].split("```")[0]) == lora


def test_the_cards_base_model_reads_past_a_merge_whose_inputs_are_a_list():
    """A merge's manifest lists its input folders (`inputs` is a list, not a training stage's {"model": ...}): the
    chain is followed past it to the Hub id the runs started from (the tiny pipeline's release failed there)."""
    chain = [
        (Path("runs/x/dpo"), {"inputs": {"model": "runs/x/sft"}}),
        (Path("runs/x/merge"), {"inputs": ["runs/x/seed1", "runs/x/seed2"], "hyperparameters": ["not", "a", "dict"]}),
        (Path("runs/x/seed1"), {"hyperparameters": {"model_name_or_path": "amd/Instella-3B"}}),
    ]
    assert base_model(chain) == "amd/Instella-3B"
    assert base_model(chain[:2]) is None
