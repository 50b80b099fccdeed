"""The end-to-end half of tests/unit/post_training/test_dpo.py: tiny DPO training (the tiny recipe) raises the
preference margin and accuracy, and the finished stage writes its model, template, state and manifest."""

import json

import pytest
import torch

from instella_recipes.core import read_manifest
from instella_recipes.post_training import dpo
from tests.unit.post_training.test_dpo import completion_logps, recipe

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_tiny_dpo_raises_margin_and_accuracy(tiny_model_dir, tmp_path):
    out = tmp_path / "dpo"
    argv, (training_args, model_args) = recipe(tiny_model_dir, out)
    trainer, data = dpo.build_trainer(training_args, model_args)
    pairs = [trainer.train_dataset[i] for i in range(32)]
    batch = trainer.data_collator(pairs)

    def margins():
        trainer.model.eval()
        with torch.no_grad():
            logps, _ = completion_logps(trainer.model, batch)
        chosen, rejected = logps.chunk(2)
        return chosen - rejected

    before = margins()
    trainer.train()
    after = margins()
    assert after.mean() > before.mean() + 0.5  # chosen minus rejected log-prob rises
    assert (after > 0).float().mean() > (before > 0).float().mean()

    logs = [h for h in trainer.state.log_history if "rewards/margins" in h]
    assert logs[-1]["rewards/margins"] > logs[0]["rewards/margins"]
    assert logs[-1]["rewards/accuracies"] > logs[0]["rewards/accuracies"]

    dpo.DPOStage(training_args, model_args, argv).finish(trainer, data)
    manifest = read_manifest(out)
    assert manifest["stage"] == "dpo" and manifest["data"]["kept"] == 400
    assert json.loads((out / "trainer_state.json").read_text())["log_history"]
    assert (out / "chat_template.jinja").is_file() and (out / "model.safetensors").is_file()
