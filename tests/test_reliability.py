"""Issue 13: no silent success. Non-finite input weights are refused (naming the tensor) before training, merging
or converting; a run whose every step was skipped fails; a run that died before its first checkpoint does not pin
its folder; a damaged newest checkpoint falls back to the previous complete one."""

import json
import logging

import pytest
import torch
from conftest import tiny_config
from instella_recipes.scripts.pretrain import main as pretrain_main
from safetensors.torch import load_file, save_file

from instella_recipes.core import RecipeError, check_model_folder
from instella_recipes.training.checkpoints import find_resume_checkpoint
from modeling_instella import InstellaForCausalLM
from tests.pretrain_utils import prepare_tiny, pretrain_argv

pytestmark = pytest.mark.usefixtures("one_thread")
NAN_PLUGIN = ["--plugins", "instella_recipes.training.fault_injection:nan_loss"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


def poisoned_model(folder, value=float("nan"), key="model.layers.1.mlp.up_proj.weight"):
    """A saved tiny Instella with one bad value in `key`."""
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config()).save_pretrained(folder)
    state = load_file(folder / "model.safetensors")
    state[key].view(-1)[5] = value
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_stage2_from_a_checkpoint_with_nan_is_refused_before_training(data_dir, tmp_path, capsys):
    source = poisoned_model(tmp_path / "stage1")
    out = tmp_path / "stage2"
    argv = pretrain_argv(data_dir, out, max_steps=2, model_config="", model_name_or_path=source)
    argv.remove("--model_config")
    argv.remove("")
    with pytest.raises(SystemExit) as exc:
        pretrain_main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "tensor model.layers.1.mlp.up_proj.weight holds 1 non-finite value(s)" in err and str(source) in err
    assert not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_merge_and_convert_refuse_non_finite_tensors(tmp_path, capsys, value):
    from instella_recipes.scripts.convert_checkpoint import main as convert_main
    from instella_recipes.scripts.merge import main as merge_main

    good = tmp_path / "good"
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config()).save_pretrained(good)
    bad = poisoned_model(tmp_path / "bad", value, key="model.norm.weight")
    with pytest.raises(SystemExit) as exc:
        merge_main(["--inputs", str(good), str(bad), "--output_dir", str(tmp_path / "merged")])
    assert exc.value.code == 2 and "tensor model.norm.weight holds 1 non-finite" in capsys.readouterr().err
    assert not (tmp_path / "merged").exists()
    with pytest.raises(SystemExit) as exc:
        convert_main(["to-training", "--input", str(bad), "--output", str(tmp_path / "olmo")])
    assert exc.value.code == 2 and "model.norm.weight" in capsys.readouterr().err
    assert not (tmp_path / "olmo").exists()


def test_a_run_whose_every_step_was_skipped_is_a_failure(data_dir, tmp_path, capsys):
    out = tmp_path / "all_skipped"
    argv = pretrain_argv(data_dir, out, max_steps=3, save_steps=100, max_consecutive_nonfinite=5) + NAN_PLUGIN
    with pytest.raises(SystemExit) as exc:
        pretrain_main(argv + ["--plugin_args", '{"nan_steps": [1, 2, 3]}'])
    assert exc.value.code == 3
    assert "every one of the 3 steps of this run was skipped" in capsys.readouterr().err
    assert not (out / "manifest.json").exists() and not (out / "model.safetensors").exists()


def test_a_run_that_failed_before_its_first_step_does_not_pin_the_folder(data_dir, tmp_path):
    out = tmp_path / "run"
    failing = pretrain_argv(data_dir, out, max_steps=2, save_steps=100, learning_rate=-1e-3)
    with pytest.raises(SystemExit):  # refused at parse time: nothing written
        pretrain_main(failing)
    assert not out.exists()
    plugin = ["--plugins", "tests.pretrain_utils:fail_before_first_step"]
    with pytest.raises(RuntimeError, match="before the first step"):
        pretrain_main(pretrain_argv(data_dir, out, max_steps=2, save_steps=100, learning_rate=1e-2) + plugin)
    assert (out / "run.json").is_file() and not list(out.glob("checkpoint-*"))
    # the corrected command (another learning rate, no failing plugin) runs in the same folder
    assert pretrain_main(pretrain_argv(data_dir, out, max_steps=2, save_steps=100)) == 0
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 2


def _checkpoint(folder, step: int):
    path = folder / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    save_file({"w": torch.ones(4, 4)}, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("damage", ["truncated", "random_bytes", "empty"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one(tmp_path, caplog, damage):
    _checkpoint(tmp_path, 2)
    newest = _checkpoint(tmp_path, 4) / "model.safetensors"
    data = newest.read_bytes()
    damaged = {"truncated": data[: len(data) // 2], "random_bytes": bytes(range(256)) * 8, "empty": b""}
    newest.write_bytes(damaged[damage])
    with caplog.at_level(logging.WARNING, logger="instella_recipes"):
        assert find_resume_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")
    assert "checkpoint-4 is damaged" in caplog.text and "resuming from the previous complete checkpoint" in caplog.text
    (tmp_path / "checkpoint-2" / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(RecipeError, match="every checkpoint in .* is damaged"):
        find_resume_checkpoint(tmp_path)


def test_a_model_folder_with_a_truncated_shard_is_a_clear_error(tmp_path):
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config()).save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(RecipeError, match=r"model.safetensors: not a readable safetensors file"):
        check_model_folder(tmp_path, "model_name_or_path")
