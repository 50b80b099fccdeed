"""Issue 24.9: SIGTERM at every phase of an SFT, DPO or pretraining run ends it with exit 0 in a consistent state:
during start-up (imports, tokenizer, dataset map, model load) with nothing written, during training with a checkpoint
and no manifest (the next run resumes from it and finishes), during the final save after that save (manifest).

The process signals itself at the phase, through a wrapper around the phase's function or the fault-injection
callbacks (instella_recipes/pretraining/fault_injection.py), so the moment is exact; the import phase is hit from
outside, as soon as the entry point has its handler in place (seen in /proc/<pid>/status)."""

import os
import signal
from pathlib import Path

import pytest

from instella_recipes.core import read_manifest
from instella_recipes.post_training import dpo, sft
from instella_recipes.post_training import shared as post_run
from instella_recipes.pretraining import pretrain as pretrain_module
from instella_recipes.pretraining.fault_injection import kill_at_step, signal_at_phase
from instella_recipes.trainer.checkpoints import find_resume_checkpoint
from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv

ROOT = Path(__file__).resolve().parents[3]
RECIPES = {"sft": ROOT / "recipes" / "tiny" / "sft.yaml", "dpo": ROOT / "recipes" / "tiny" / "dpo.yaml"}
SCRIPTS = {"sft": sft, "dpo": dpo}
PREPARE = {"sft": "prepare_sft_dataset", "dpo": "prepare_dpo_dataset"}
# 4 optimizer steps of 4 rows on 16 rows of the TinyWorld chats / preference pairs
SMALL = ["--max_samples", "16", "--per_device_train_batch_size", "4", "--global_batch_size", "4", "--max_steps", "4"]
SMALL += ["--logging_steps", "1", "--report_to", "none", "--save_strategy", "no"]

pytestmark = pytest.mark.usefixtures("one_thread")


def _argv(stage: str, model_dir, out) -> list[str]:
    return ["--config", str(RECIPES[stage]), "--model_name_or_path", str(model_dir), "--output_dir", str(out), *SMALL]


def _sigterm_then(function):
    """`function`, with SIGTERM to this process as it starts (the handler only records it; the phase runs on)."""

    def wrapper(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return function(*args, **kwargs)

    return wrapper


def _with_callback(make_callback):
    """The stage's `build_trainer` with one more callback on the trainer (a fault-injection one)."""
    original = post_run.PostTrainingStage.build_trainer

    def wrapper(self, *args, **kwargs):
        trainer = original(self, *args, **kwargs)
        trainer.add_callback(make_callback())
        return trainer

    return wrapper


def _nothing_written(out: Path) -> bool:
    return not out.exists() or not any(out.iterdir())


@pytest.mark.parametrize("stage", ["sft", "dpo"])
@pytest.mark.parametrize("phase", ["tokenizer", "data", "model"])
def test_sigterm_at_every_phase_of_post_training_exits_zero_consistently(
    stage, phase, tiny_model_dir, tmp_path, monkeypatch, caplog
):
    """Start-up; training and the final save (whole runs, resumed): tests/e2e/test_preemption_entry_points.py."""
    sigterm_at(stage, phase, tiny_model_dir, tmp_path, monkeypatch, caplog)


def sigterm_at(stage, phase, tiny_model_dir, tmp_path, monkeypatch, caplog) -> None:
    """SIGTERM at `phase` of an SFT or DPO run: exit 0, the handler given back, and the phase's consistent state."""
    out = tmp_path / stage
    argv = _argv(stage, tiny_model_dir, out)
    if phase == "tokenizer":
        monkeypatch.setattr(
            post_run, "load_tokenizer_with_template", _sigterm_then(post_run.load_tokenizer_with_template)
        )
    elif phase == "data":  # the tokenizing dataset.map runs with the request pending
        monkeypatch.setattr(SCRIPTS[stage], PREPARE[stage], _sigterm_then(getattr(SCRIPTS[stage], PREPARE[stage])))
    elif phase == "model":
        monkeypatch.setattr(post_run, "load_model", _sigterm_then(post_run.load_model))
    elif phase == "train":  # SIGTERM at the end of step 2
        callback = lambda: kill_at_step(None, {"kill_step": 2, "kill_signal": "TERM"})[0]
        monkeypatch.setattr(post_run.PostTrainingStage, "build_trainer", _with_callback(callback))
    else:  # SIGTERM as training ends, before the final save
        monkeypatch.setattr(
            post_run.PostTrainingStage,
            "build_trainer",
            _with_callback(lambda: signal_at_phase(None, {"phase": "end"})[0]),
        )
    with caplog.at_level("INFO"):
        assert SCRIPTS[stage].main(argv) == 0
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the run gave the handler back

    if phase in ("tokenizer", "data", "model"):
        assert "pre-empted during start-up" in caplog.text and _nothing_written(out)
    elif phase == "train":  # stopped at the end of step 3 with its checkpoint, no manifest; the next run finishes it
        assert f"{stage}: pre-empted; saved checkpoint-3" in caplog.text
        assert find_resume_checkpoint(out).endswith("checkpoint-3") and read_manifest(out) is None
        monkeypatch.undo()
        assert SCRIPTS[stage].main(argv) == 0
        assert read_manifest(out)["global_step"] == 4
    else:  # the final save ran to its end
        assert read_manifest(out)["global_step"] == 4


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return prepare_tiny(tmp_path_factory.mktemp("data"))


@pytest.mark.parametrize("phase", ["data", "model"])
def test_sigterm_while_pretraining_loads_its_data_or_model_exits_zero(phase, data_dir, tmp_path, monkeypatch, caplog):
    """The other pretraining phases are in test_pretrain_resume.py (plugins, training, final save)."""
    name = "_data_and_tokenizer" if phase == "data" else "build_model"
    monkeypatch.setattr(pretrain_module, name, _sigterm_then(getattr(pretrain_module, name)))
    out = tmp_path / "run"
    with caplog.at_level("INFO"):
        assert pretrain_module.main(pretrain_argv(data_dir, out, max_steps=2)) == 0
    where = "after loading the data" if phase == "data" else "after loading the model"
    assert f"pre-empted during start-up ({where})" in caplog.text and not out.exists()
