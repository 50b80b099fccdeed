"""The end-to-end half of tests/unit/pretraining/test_moe.py: two tiny ZAYA1 training runs, the bias controller off and
on: off, routing collapses onto few experts; on, the controller keeps the expert loads balanced; the loss falls in
both."""

import pytest
import torch

from tests.unit.pretraining.test_moe import plugins, recipe_model, train

pytestmark = pytest.mark.usefixtures("one_thread")


def test_zaya_controller_balances_expert_load_and_loss_goes_down(tmp_path):
    runs = {}
    for on in (False, True):
        model, recipe = recipe_model("tiny_zaya.yaml", vocab_size=128)
        enabled = {"expert_load_logging"} | ({"zaya_bias_controller"} if on else set())
        logs = train(model, plugins(model, recipe, enabled), tmp_path / str(on))
        assert logs[-1]["loss"] < logs[0]["loss"] - 0.5
        assert {"moe/l0/e0", "moe/l1/e7", "moe/load_cv", "moe/skip_fraction"} <= logs[-1].keys()
        fractions = [logs[-1][f"moe/l0/e{e}"] for e in range(8)]
        assert sum(fractions) == pytest.approx(1.0, abs=1e-4)
        biases = model.model.layers[0].mlp.gate.balancing_biases
        runs[on] = ([row["moe/load_cv"] for row in logs], biases.clone())
    (cv_off, biases_off), (cv_on, biases_on) = runs[False], runs[True]
    # Off: routing collapses onto few experts and stays there; biases untouched.
    assert min(cv_off) > 1.0 and torch.equal(biases_off[:8], torch.zeros(8))
    # On: the controller moves the loads toward balance, and keeps them there.
    assert max(cv_on[1:]) < 0.6 * min(cv_off) and cv_on[-1] < cv_on[0]
    assert biases_on[:8].abs().sum() > 0 and biases_on[8] == -1.0  # the skip route's bias is left alone
