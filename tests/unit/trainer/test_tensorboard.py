"""TensorBoard is the recipes' training log: a tiny run writes event files that tensorboard's own reader
(EventAccumulator) parses, with the loss the Trainer logged at every step; the recipes report to it by default and
keep tqdm's progress bars on."""

import json
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from instella_recipes.pretraining.pretrain import main
from tests.helpers.pretrain_utils import prepare_tiny, pretrain_argv

ROOT = Path(__file__).resolve().parents[3]
TRAINING_RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if "report_to" in p.read_text())


@pytest.mark.usefixtures("one_thread")
def test_tiny_run_writes_event_files_with_the_loss(tmp_path):
    data = prepare_tiny(tmp_path / "data")
    out = tmp_path / "run"
    assert main(pretrain_argv(data, out, max_steps=3, save_steps=100, report_to="tensorboard")) == 0
    event_files = list((out / "runs").glob("*/events.out.tfevents.*"))
    assert len(event_files) == 1
    events = EventAccumulator(str(event_files[0].parent))
    events.Reload()
    assert "train/loss" in events.Tags()["scalars"]
    logged = [h for h in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in h]
    scalars = events.Scalars("train/loss")
    assert [s.step for s in scalars] == [h["step"] for h in logged] == [1, 2, 3]
    assert [s.value for s in scalars] == pytest.approx([h["loss"] for h in logged], rel=1e-6)


@pytest.mark.parametrize("recipe", TRAINING_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_training_recipes_log_to_tensorboard_with_progress_bars(recipe):
    values = yaml.safe_load(recipe.read_text())
    assert values["report_to"] == "tensorboard"
    assert not values.get("disable_tqdm", False)
