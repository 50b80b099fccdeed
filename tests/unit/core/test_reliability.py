"""Issue 13: no silent success. Non-finite input weights are refused (naming the tensor) before training, merging
or converting; a run whose every step was skipped fails; a run that died before its first checkpoint does not pin
its folder; a damaged newest checkpoint falls back to the previous complete one."""

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from instella_recipes.core import RecipeError, atomic_output_dir, read_manifest, write_manifest
from instella_recipes.pretraining.pretrain import main as pretrain_main
from instella_recipes.trainer.checkpoints import find_resume_checkpoint
from instella_recipes.weights import check_model_folder
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config
from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv

pytestmark = pytest.mark.usefixtures("one_thread")
NAN_PLUGIN = ["--plugins", "instella_recipes.pretraining.fault_injection:nan_loss"]


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
    from instella_recipes.checkpoint.convert import main as convert_main
    from instella_recipes.checkpoint.merge import main as merge_main

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
    plugin = ["--plugins", "tests.helpers.pretrain_utils:fail_before_first_step"]
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


# --- issue 24: the output-folder rule, manifests that record what they describe, failures of the machine ----------
CHAT = {"messages": [{"role": "user", "content": "2 + 3?"}, {"role": "assistant", "content": "5"}]}


@pytest.fixture(scope="module")
def post_world(tmp_path_factory, tiny_tokenizer):
    """A tiny model folder (with its tokenizer), a chat jsonl and a text jsonl, made once."""
    root = tmp_path_factory.mktemp("post_world")
    torch.manual_seed(0)
    InstellaForCausalLM(tiny_config(vocab_size=len(tiny_tokenizer))).save_pretrained(root / "model")
    tiny_tokenizer.save_pretrained(root / "model")
    (root / "chat.jsonl").write_text((json.dumps(CHAT) + "\n") * 8)
    (root / "text.jsonl").write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(300)))
    return root


def test_release_into_its_own_input_is_refused_and_the_input_kept(post_world, tmp_path, capsys):
    from instella_recipes.checkpoint.release import main as release_main

    folder = tmp_path / "sft"
    shutil.copytree(post_world / "model", folder)
    (folder / "trainer_state.json").write_text("{}")
    write_manifest(folder, "sft")
    for output in (folder, folder.parent):  # the input itself, or a folder holding it
        with pytest.raises(SystemExit) as exc:
            release_main(["--model_dir", str(folder), "--output_dir", str(output), "--overwrite", "true"])
        assert exc.value.code == 2 and "a stage never writes over its own input" in capsys.readouterr().err
    assert (folder / "trainer_state.json").is_file() and read_manifest(folder)["stage"] == "sft"


def test_an_atomic_output_is_swapped_manifest_first(tmp_path):
    """Replacing a complete output: the old folder loses its manifest before it is renamed aside and removed, and
    the new one appears complete (its manifest written inside before the rename)."""
    from instella_recipes.core import atomic_output_dir

    out = tmp_path / "out"
    with atomic_output_dir(out) as partial:
        (partial / "weights.bin").write_bytes(b"old")
        write_manifest(partial, "merge")
    with pytest.raises(RecipeError, match="holds a complete 'merge' output"):
        with atomic_output_dir(out):
            pass
    removed = []
    real_rename = os.rename

    def rename(src, dst):
        removed.append((Path(src) / "manifest.json").exists())
        real_rename(src, dst)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "rename", rename)
        with atomic_output_dir(out, overwrite=True) as partial:
            (partial / "weights.bin").write_bytes(b"new")
            write_manifest(partial, "merge")
    assert removed == [False]  # the old folder had no manifest any more when it was moved aside
    assert (out / "weights.bin").read_bytes() == b"new" and read_manifest(out)["stage"] == "merge"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_manifest_records_sizes_and_checksums_and_readers_name_the_file(tmp_path):
    from instella_recipes.core import require_complete

    out = tmp_path / "out"
    (out / "tokenizer").mkdir(parents=True)
    (out / "tokens.bin").write_bytes(bytes(range(256)) * 16)
    (out / "tokenizer" / "tokenizer.json").write_text("{}")
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "optimizer.pt").write_bytes(b"not described")
    write_manifest(out, "prepare_data")
    listed = read_manifest(out)["integrity"]["files"]
    assert sorted(listed) == ["tokenizer/tokenizer.json", "tokens.bin"] and listed["tokens.bin"]["size"] == 4096
    require_complete(out, "data_dir")
    good = (out / "tokens.bin").read_bytes()
    data = bytearray(good)
    data[100] ^= 0xFF
    (out / "tokens.bin").write_bytes(bytes(data))
    with pytest.raises(RecipeError, match=r"data_dir .*: tokens.bin does not match the checksum in its manifest"):
        require_complete(out, "data_dir")
    (out / "tokens.bin").write_bytes(bytes(data[:-1]))
    with pytest.raises(RecipeError, match=r"tokens.bin is 4095 bytes, its manifest.json says 4096"):
        require_complete(out, "data_dir")
    (out / "tokens.bin").write_bytes(good)
    (out / "tokenizer" / "tokenizer.json").unlink()
    with pytest.raises(RecipeError, match=r"tokenizer/tokenizer.json is missing"):
        require_complete(out, "data_dir")


def test_a_model_folder_changed_after_its_manifest_is_named(post_world, tmp_path):
    folder = tmp_path / "sft"
    shutil.copytree(post_world / "model", folder)
    write_manifest(folder, "sft")
    (folder / "config.json").write_text((folder / "config.json").read_text() + " ")
    with pytest.raises(RecipeError, match=r"model_name_or_path .*: config.json is \d+ bytes, its manifest"):
        check_model_folder(folder, "model_name_or_path")


def test_claim_empties_only_a_complete_output(tmp_path):
    """`--overwrite` replaces a complete output; an interrupted run (no manifest) is kept, so the same command
    requeued with `--overwrite` resumes it instead of starting over each time."""
    from instella_recipes.core import claim_output_dir

    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "trainer_state.json").write_text("{}")
    assert claim_output_dir(tmp_path, overwrite=True) == tmp_path and (tmp_path / "checkpoint-4").is_dir()
    write_manifest(tmp_path, "pretrain")
    with pytest.raises(RecipeError, match="holds a complete 'pretrain' output"):
        claim_output_dir(tmp_path)
    claim_output_dir(tmp_path, overwrite=True)
    assert list(tmp_path.iterdir()) == []


def test_a_folder_written_whole_never_replaces_someone_elses_files_without_overwrite(tmp_path):
    """`atomic_output_dir` (convert, merge, reshape's export, release, prepare) refuses a non-empty folder that is no
    finished output unless `overwrite`, and leaves its files; an empty folder is simply used."""
    theirs = tmp_path / "hf_folder"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(RecipeError, match="holds files but no finished output.*--overwrite true"):
        with atomic_output_dir(theirs) as partial:
            (partial / "model.safetensors").write_text("new")
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]
    assert not (tmp_path / "hf_folder.partial").exists()
    with atomic_output_dir(theirs, overwrite=True) as partial:
        (partial / "model.safetensors").write_text("new")
    assert sorted(p.name for p in theirs.iterdir()) == ["model.safetensors"]
    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_output_dir(empty) as partial:
        (partial / "a.txt").write_text("a")
    assert (empty / "a.txt").read_text() == "a"
