"""The lifecycle runs a stage's training features at its points (`trainer/features/`): their checks right after
`stage.check()` and before any data loads, their data checks after it, their Trainer keyword arguments merged in
the stage's order, their extras before the manifest."""

from types import SimpleNamespace

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.trainer import features
from instella_recipes.trainer.features import Feature, optimizer, sequence_parallel
from instella_recipes.trainer.stage import Stage


class Recorded(Stage):
    """A stage whose hooks record the order they ran in; its data load must never be reached when a check fails."""

    name = "recorded"

    def __init__(self, args, order: list):
        super().__init__(args)
        self.order = order

    def check(self):
        self.order.append("stage.check")

    def load_data(self):
        self.order.append("stage.load_data")
        return "data"

    def build_model(self, data):
        return SimpleNamespace(config=None)

    def build_trainer(self, data, model, callbacks):
        return self.feature_kwargs(data, model)


def recording(name: str, order: list) -> Feature:
    return Feature(
        name=name,
        check=lambda stage: order.append(f"{name}.check"),
        check_data=lambda stage, data: order.append(f"{name}.check_data({data})"),
        trainer_kwargs=lambda stage, data, model: {name: len(order)},
    )


def test_feature_hooks_run_in_the_declared_order_around_the_stages():
    order = []
    stage = Recorded(SimpleNamespace(), order)
    stage.features = (recording("a", order), recording("b", order))
    kwargs, data = stage.build()
    assert order == ["stage.check", "a.check", "b.check", "stage.load_data", "a.check_data(data)",
                     "b.check_data(data)"]  # fmt: skip
    assert data == "data" and kwargs == {"a": 6, "b": 6}


def test_a_bad_schedule_stops_a_stage_with_the_optimizer_feature_before_any_data():
    """GRPO had no OLMo-schedule check (its trainer lacked the optimizer feature); now every stage carrying it does."""
    order = []
    stage = Recorded(SimpleNamespace(lr_scheduler_kwargs={"alpha_f": 2.0}), order)
    stage.features = (optimizer.FEATURE,)
    with pytest.raises(RecipeError, match=r"lr_scheduler_kwargs.alpha_f must be"):
        stage.build()
    assert order == ["stage.check"]


def test_the_sequence_parallel_rule_is_checked_on_the_stages_rows_before_any_data():
    args = SimpleNamespace(sequence_parallel_size=2, world_size=2, per_device_train_batch_size=1)
    stage = Recorded(args, [])
    stage.features = (sequence_parallel.FEATURE,)
    stage.row_length = lambda data=None: (4097, "seq_len")
    with pytest.raises(RecipeError, match="seq_len 4097 is not divisible by sequence_parallel_size 2"):
        features.run_checks(stage)
    stage.row_length = lambda data=None: (4096, "seq_len")
    features.run_checks(stage)  # passes
