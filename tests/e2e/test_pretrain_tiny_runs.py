"""The end-to-end half of tests/unit/pretraining/test_pretrain_tiny.py: tiny pretraining runs that learn (every
parameter changes, the schedule is OLMo's) and that skip non-finite steps until a divergence stops the run."""

import json

import pytest
import torch
from safetensors.torch import load_file

from instella_recipes.pretraining.pretrain import main
from instella_recipes.trainer.features.optimizer import olmo_lr_factor
from tests.helpers.pretrain_utils import pretrain_argv
from tests.unit.pretraining import test_pretrain_tiny as unit_half  # the fixture and helper both halves use

data_dir, losses = unit_half.data_dir, unit_half.losses

pytestmark = pytest.mark.usefixtures("one_thread")


def test_tiny_run_learns_changes_every_parameter_and_follows_the_schedule(data_dir, tmp_path):
    out = tmp_path / "run"
    assert main(pretrain_argv(data_dir, out, max_steps=12, save_steps=100)) == 0
    init_dir = tmp_path / "init"
    assert main(pretrain_argv(data_dir, init_dir, max_steps=1, learning_rate=0.0, save_steps=100)) == 0
    history = losses(out)
    assert [h["step"] for h in history] == list(range(1, 13))
    assert sum(h["loss"] for h in history[-3:]) / 3 < sum(h["loss"] for h in history[:3]) / 3 - 0.5
    for h in history:  # the LR applied in update k (1-based) is the formula at k, as OLMo indexes it (SPEC.md 2.1)
        expected = 3e-3 * olmo_lr_factor(h["step"], warmup_steps=3, total_steps=12, decay="cosine", alpha_f=0.1)
        assert h["learning_rate"] == pytest.approx(expected, rel=1e-6)
    before, after = load_file(init_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert set(before) == set(after) and len(before) == 2 * 11 + 3
    unchanged = [k for k in before if torch.equal(before[k], after[k])]
    assert unchanged == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "pretrain" and manifest["global_step"] == 12 and manifest["skipped_steps"] == 0
    assert (out / "modeling_instella.py").is_file() and (out / "tokenizer.json").is_file()
    # the same command again finds the finished run and does nothing
    assert main(pretrain_argv(data_dir, out, max_steps=12, save_steps=100)) == 0


def test_nonfinite_steps_are_skipped_and_a_divergence_stops_the_run(data_dir, tmp_path, capsys):
    plugin = ["--plugins", "instella_recipes.pretraining.fault_injection:nan_loss"]
    out = tmp_path / "skip"
    argv = pretrain_argv(data_dir, out, max_steps=6, save_steps=100) + plugin
    assert main(argv + ["--plugin_args", '{"nan_steps": [3]}']) == 0
    assert json.loads((out / "manifest.json").read_text())["skipped_steps"] == 1

    out = tmp_path / "diverge"
    argv = pretrain_argv(data_dir, out, max_steps=10, save_steps=2, max_consecutive_nonfinite=3) + plugin
    with pytest.raises(SystemExit) as exc:
        main(argv + ["--plugin_args", '{"nan_steps": [5, 6, 7, 8]}'])
    assert exc.value.code == 3
    assert "3 non-finite steps in a row from step 5" in capsys.readouterr().err
    assert not (out / "manifest.json").exists()
    kept = load_file(out / "checkpoint-7" / "model.safetensors")
    good = load_file(out / "checkpoint-4" / "model.safetensors")
    assert all(torch.equal(kept[k], good[k]) for k in good)  # no update since the last good step
    assert not (out / "checkpoint-6").exists()  # nothing saved during the streak
