"""Instella-Long's pretraining settings, in process: a phase's `rope_theta` must be its start checkpoint's (the
reconfigure command is named), `optimizer_state_from` names the run whose AdamW state continues, and a sequence
parallel size the launch cannot hold fails with one line before any work (the shapes: tests/unit/trainer/
test_sequence_parallel.py; the runs on 2 and 4 processes: tests/e2e/)."""

import json

import pytest

from instella_recipes.checkpoint.convert import main as convert
from instella_recipes.core import parse_recipe
from instella_recipes.pretraining.pretrain import PretrainArguments, _model_config, main
from instella_recipes.trainer.features.sequence_parallel import check_sequence_parallel
from modeling_instella import InstellaConfig, InstellaForCausalLM
from tests.helpers.pretrain_utils import TINY_MODEL, prepare_tiny, pretrain_argv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="module")
def start(tmp_path_factory):
    """A 'released' tiny model (RoPE base 10,000) and its long-context start point (base 514,640)."""
    folder = tmp_path_factory.mktemp("models")
    fields = {k: v for k, v in TINY_MODEL.items() if k != "model_type"}
    InstellaForCausalLM(InstellaConfig(**fields)).save_pretrained(folder / "instruct")
    argv = ["reconfigure", "--input", str(folder / "instruct"), "--output", str(folder / "start"),
            "--rope_theta", "514640", "--max_position_embeddings", "256"]  # fmt: skip
    assert convert(argv) == 0
    return folder


def test_heads_the_sp_size_cannot_split_are_named_before_any_data(data_dir, tmp_path, capsys):
    """A from-scratch config with 4 heads and SP 8 on 8 processes: the heads, not the world size, are the problem
    (the world size is faked: the check runs before any process group is needed)."""
    argv = pretrain_argv(data_dir, tmp_path / "x", per_device_train_batch_size=1, sequence_parallel_size=8)
    (args,) = parse_recipe([PretrainArguments], argv)
    with pytest.raises(ValueError, match="does not divide the model's attention heads"):
        check_sequence_parallel(8, 64, 8, _model_config(args), 1)


def _argv(data_dir, out, model, **overrides):
    argv = pretrain_argv(data_dir, out, max_steps=1, save_steps=100, **overrides)
    at = argv.index("--model_config")
    return argv[:at] + argv[at + 2 :] + ["--model_name_or_path", str(model)]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"rope_theta": 514640}, "rope_theta 514640 (recipe) but model_name_or_path"),
        ({"sequence_parallel_size": 2}, "sequence_parallel_size 2 does not divide the world size (1 processes)"),
        ({"optimizer_state_from": "/nonexistent/phase1"}, "/nonexistent/phase1/optimizer_state"),
        ({"optimizer_state_from": "x", "load_optimizer_state": "true"}, "not both"),
        ({"sequence_parallel_mode": "ring"}, "sequence_parallel_mode"),
    ],
)
def test_bad_long_context_inputs_are_one_line_before_any_work(data_dir, start, tmp_path, capsys, overrides, message):
    out = tmp_path / "bad"
    with pytest.raises(SystemExit) as exc:
        main(_argv(data_dir, out, start / "instruct", **overrides))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err, err[-2000:]
    if "rope_theta" in overrides:
        assert "convert_checkpoint.py reconfigure" in err
    assert not out.exists() or not any(out.iterdir())


def test_a_phase_trains_from_its_reconfigured_start_and_keeps_the_rope(data_dir, start, tmp_path):
    out = tmp_path / "phase1"
    assert main(_argv(data_dir, out, start / "start", rope_theta=514640, save_optimizer_state="true")) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["rope_theta"] == 514640 and config["max_position_embeddings"] == 256
    assert (out / "optimizer_state").is_dir()
    # the next phase: another model folder, this run's AdamW state (step counter and schedule start again)
    nxt = tmp_path / "phase2"
    assert main(_argv(data_dir, nxt, start / "start", rope_theta=514640, optimizer_state_from=str(out))) == 0
