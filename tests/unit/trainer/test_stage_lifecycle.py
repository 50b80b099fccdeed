"""The training lifecycle (`trainer/stage.py`) and the settings roles (`trainer/settings.py`) that every stage shares:
a field cannot be missed by the run identity, the manifest or the model card; one resume rule; `report_to` comma
lists; LoRA adapters that load from anywhere; model cards with `base_model` and `datasets` in the Hub's layout."""

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from instella_recipes.checkpoint.release import ReleaseArguments, card_data, resolved_hyperparameters
from instella_recipes.core import RecipeError, parse_recipe, read_manifest
from instella_recipes.post_training import dpo, sft
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.pretraining.pretrain import PretrainArguments
from instella_recipes.trainer.checkpoints import resolve_resume
from instella_recipes.trainer.settings import RUN, field_roles, library_roles, split_report_to
from instella_recipes.trainer.stage import Stage, common_manifest_fields

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = [PretrainArguments, sft.CheckedSFTConfig, dpo.CheckedDPOConfig, CheckedModelConfig]
TINY = {"sft": ROOT / "recipes" / "tiny" / "sft.yaml", "dpo": ROOT / "recipes" / "tiny" / "dpo.yaml"}
STAGES = {"sft": sft, "dpo": dpo}
SMALL = ["--max_samples", "8", "--per_device_train_batch_size", "4", "--global_batch_size", "4", "--max_steps", "1"]
SMALL += ["--report_to", "none", "--save_strategy", "no"]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("cls", SETTINGS, ids=lambda c: c.__name__)
def test_every_field_of_every_stage_settings_class_has_a_role(cls):
    roles = field_roles(cls)
    assert set(roles) == {f.name for f in dataclasses.fields(cls)}
    assert roles["learning_rate" if cls is not CheckedModelConfig else "model_name_or_path"] == RUN


def test_the_library_fields_named_as_run_fields_exist():
    """Each class names the library fields it uses (`library_roles`, no global list); a library renaming one would
    silently drop it from identities and cards, so a name the class has no field for is refused."""
    for cls in SETTINGS:
        assert set(library_roles(cls)) <= {f.name for f in dataclasses.fields(cls)}
    assert field_roles(dpo.CheckedDPOConfig)["beta"] == field_roles(PretrainArguments)["weight_decay"] == RUN

    @dataclasses.dataclass
    class Renamed(dpo.CheckedDPOConfig):
        library_roles = {"beta_renamed": RUN}

    with pytest.raises(TypeError, match=r"Renamed: library_roles names \['beta_renamed'\]"):
        field_roles(Renamed)


def _sft_settings(cls, tmp_path, *extra):
    argv = ["--config", str(TINY["sft"]), "--output_dir", str(tmp_path / "out"), "--use_cpu", "true", *extra]
    return parse_recipe([cls, CheckedModelConfig], argv)


def test_a_new_field_cannot_be_missed(tmp_path):
    """A stage gains a field: with a role it reaches the identity, the manifest and the model card with no list
    to update; without one, the stage refuses to start."""

    @dataclasses.dataclass
    class WithKnob(sft.CheckedSFTConfig):
        new_knob: int = dataclasses.field(default=1, metadata={"role": RUN, "help": "a new setting"})

    args, model_args = _sft_settings(WithKnob, tmp_path, "--new_knob", "7")
    stage = sft.SFTStage(args, model_args, ["--config", str(TINY["sft"])])
    identity = stage.identity(None)
    assert identity["new_knob"] == 7
    other, _ = _sft_settings(WithKnob, tmp_path, "--new_knob", "8")
    assert sft.SFTStage(other, model_args).identity(None)["fingerprint"] != identity["fingerprint"]
    trainer = SimpleNamespace(
        args=args, state=SimpleNamespace(log_history=[{"loss": 1.5}], global_step=3)
    )  # what common_manifest_fields reads of a trainer
    data = SimpleNamespace(report={"kept": 8})  # what SFT's manifest_fields reads of its data
    manifest = {"stage": "sft", **common_manifest_fields(stage, trainer, identity, data)}
    assert manifest["hyperparameters"]["new_knob"] == 7 and manifest["arguments"]["training"]["new_knob"] == 7
    hyper, origin = resolved_hyperparameters(json.loads(json.dumps(manifest, default=str)), {})
    assert hyper["new_knob"] == 7 and hyper["learning_rate"] == args.learning_rate and "overrides" in origin
    assert "output_dir" not in hyper and "logging_steps" not in hyper  # launch fields are no hyperparameters

    @dataclasses.dataclass
    class Unlabelled(sft.CheckedSFTConfig):
        forgotten: int = dataclasses.field(default=1, metadata={"help": "no role"})

    args, model_args = _sft_settings(Unlabelled, tmp_path)
    with pytest.raises(TypeError, match="Unlabelled.forgotten has no role"):
        Stage(args, model_args).identity(None)


def test_one_resume_rule(tmp_path):
    assert resolve_resume("auto", tmp_path / "fresh") is None  # nothing to resume: a fresh start
    assert resolve_resume("none", tmp_path) is None and resolve_resume(None, tmp_path) is None
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text("{}")
    assert resolve_resume("auto", tmp_path) == str(tmp_path / "checkpoint-2")
    assert resolve_resume(str(tmp_path / "checkpoint-2"), tmp_path / "elsewhere") == str(tmp_path / "checkpoint-2")
    with pytest.raises(RecipeError, match="resume_from_checkpoint .* does not exist"):
        resolve_resume(str(tmp_path / "checkpoint-9"), tmp_path)
    for cls in SETTINGS[:3]:  # the default of every stage
        assert next(f for f in dataclasses.fields(cls) if f.name == "resume_from_checkpoint").default == "auto"


def test_report_to_takes_a_comma_list_as_the_trainer_documents(tmp_path):
    assert split_report_to("tensorboard,wandb") == ["tensorboard", "wandb"]
    assert split_report_to(["tensorboard, wandb"]) == ["tensorboard", "wandb"]
    assert split_report_to("none") == "none" and split_report_to(None) is None
    args, _ = _sft_settings(sft.CheckedSFTConfig, tmp_path, "--report_to", "tensorboard,codecarbon")
    assert args.report_to == ["tensorboard", "codecarbon"]
    (pretrain,) = parse_recipe(
        [PretrainArguments],
        ["--output_dir", str(tmp_path), "--use_cpu", "true", "--report_to", "tensorboard,codecarbon"],
    )
    assert pretrain.report_to == ["tensorboard", "codecarbon"]


@pytest.mark.parametrize("stage", ["sft", "dpo"])
def test_resume_auto_on_a_fresh_folder_starts_fresh(stage, tiny_model_dir, tmp_path):
    out = tmp_path / stage
    argv = ["--config", str(TINY[stage]), "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out)]
    assert STAGES[stage].main([*argv, *SMALL, "--resume_from_checkpoint", "auto"]) == 0
    manifest = read_manifest(out)
    assert manifest["stage"] == stage and manifest["global_step"] == 1
    assert json.loads((out / "run.json").read_text())["fingerprint"] == manifest["run"]["fingerprint"]
    # the same run again: already complete, nothing to do (the folder is left as it is)
    assert STAGES[stage].main([*argv, *SMALL]) == 0 and read_manifest(out)["finished_at"] == manifest["finished_at"]


def test_a_lora_adapter_records_a_base_model_that_loads_from_anywhere(tiny_model_dir, tmp_path, monkeypatch):
    from peft import AutoPeftModelForCausalLM

    monkeypatch.chdir(tiny_model_dir.parent)
    out = tmp_path / "lora"
    lora = ["--use_peft", "true", "--lora_r", "4", "--lora_alpha", "8", "--lora_target_modules", "q_proj", "v_proj"]
    argv = ["--config", str(TINY["sft"]), "--model_name_or_path", tiny_model_dir.name, "--output_dir", str(out)]
    assert sft.main([*argv, *SMALL, *lora]) == 0  # the input model given relative to the working directory
    base = json.loads((out / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert base == str(tiny_model_dir.resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert AutoPeftModelForCausalLM.from_pretrained(out / "adapter") is not None
    assert read_manifest(out)["inputs"]["model"] == tiny_model_dir.name  # the manifest keeps what was given


def test_model_card_header_has_base_model_and_datasets_in_the_hub_layout(tmp_path):
    """Hub ids only (issue 42: the card named local paths): a DPO run from a local SFT run from `amd/Instella-3B`
    names `amd/Instella-3B`, and the Hub datasets of both runs; generated sources and local folders stay in the
    card's body."""
    dpo = {"stage": "dpo", "inputs": {"model": str(tmp_path)}, "datasets": {"sources": [{"path": "allenai/ultra"}]}}
    sft = {
        "stage": "sft",
        "inputs": {"model": "amd/Instella-3B"},
        "datasets": {
            "sources": [{"path": "HuggingFaceTB/smoltalk", "split": "train"}, {"tiny_world": {}, "split": "sft"}]
        },
    }
    args = ReleaseArguments(model_dir=str(tmp_path), output_dir=str(tmp_path / "rel"))
    header = yaml.safe_load(card_data(args, "instella", [], [(tmp_path, dpo), (tmp_path, sft)]).to_yaml())
    assert header["base_model"] == "amd/Instella-3B"
    assert header["datasets"] == ["allenai/ultra", "HuggingFaceTB/smoltalk"]
    pretrain = {"stage": "pretrain", "hyperparameters": {"model_name_or_path": "runs/stage1"}, "datasets": {}}
    header = card_data(args, "instella", [], [(tmp_path, pretrain)], {"data_dir": "runs/data"}).to_yaml()
    assert "base_model" not in yaml.safe_load(header) and "datasets" not in yaml.safe_load(header)
