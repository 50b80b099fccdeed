"""Every training stage composes its training features from its one declared tuple (`trainer/features/`), and
carries the features every training stage must (`REQUIRED`: Instella's optimizer, the fp32 gradient reduce), so a new
stage cannot silently miss one (as GRPO once missed the optimizer settings). Class names are unique across the library,
so a name in a traceback, a doc or a test names one class."""

import ast
import importlib
import pkgutil
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
from transformers import Trainer, TrainingArguments

import instella_recipes
from instella_recipes.trainer import features
from instella_recipes.trainer.features import (
    fp32_reduce,
    optimizer,
    sequence_parallel,
    settings_mixins,
    trainer_mixins,
)
from instella_recipes.trainer.settings import StageSettings
from instella_recipes.trainer.stage import Stage

LIBRARY = Path(instella_recipes.__file__).parent
STAGE_PACKAGES = ("instella_recipes.pretraining", "instella_recipes.post_training")


def training_stages() -> list[type]:
    """Every concrete `Stage` of the library (one with its own `name`), its modules imported first."""
    for package in STAGE_PACKAGES:
        for info in pkgutil.iter_modules(importlib.import_module(package).__path__, package + "."):
            importlib.import_module(info.name)
    found, todo = [], list(Stage.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if "name" in vars(cls) and cls.__module__.startswith("instella_recipes."):
            found.append(cls)
    return sorted(found, key=lambda c: c.__name__)


def test_the_four_training_stages_are_found():
    assert {c.name for c in training_stages()} == {"pretrain", "sft", "dpo", "grpo"}


@pytest.mark.parametrize("stage", training_stages(), ids=lambda c: c.name)
def test_each_stage_composes_its_declared_features_and_carries_the_required_ones(stage):
    assert features.check_composition(stage) == []


def test_the_stages_take_the_features_decided_for_them():
    """Pretraining and SFT take the six of the token stages; DPO and GRPO the optimizer and the fp32 reduce (no SP,
    MDS, continued AdamW state or token-sum divisor in the authors' DPO/GRPO); GRPO also VERL's dynamic
    micro-batches."""
    names = {c.name: [f.name for f in c.features] for c in training_stages()}
    every = ["mds_streams", "sequence_parallel", "optimizer_state", "fp32_reduce", "optimizer", "loss_reduction"]
    assert names == {"pretrain": every, "sft": every, "dpo": ["fp32_reduce", "optimizer"],
                     "grpo": ["dynamic_micro_batches", "fp32_reduce", "optimizer"]}  # fmt: skip


def test_a_stage_that_lacks_a_required_feature_or_strays_from_its_tuple_is_named():
    declared = (sequence_parallel.FEATURE, fp32_reduce.FEATURE)

    @dataclass
    class LackingSettings(StageSettings, *settings_mixins(declared), TrainingArguments):
        pass

    class LackingTrainer(*trainer_mixins(declared), Trainer):
        pass

    class LackingStage(Stage):
        name = "lacking"
        features, settings_class, trainer_class = declared, LackingSettings, LackingTrainer

    assert features.check_composition(LackingStage) == [
        "LackingStage lacks the feature 'optimizer' every training stage carries"
    ]

    class HandStacked(Stage):  # the optimizer declared, but its Trainer stacked by hand without it
        name = "hand"
        features = (*declared, optimizer.FEATURE)
        settings_class, trainer_class = LackingSettings, LackingTrainer

    settings, trainer = features.check_composition(HandStacked)
    assert "LackingSettings carries ['SequenceParallelArguments', 'FSDPReduceArguments']" in settings
    assert "LackingTrainer carries ['SequenceParallelMixin', 'FSDPReduceDtypeMixin']" in trainer


def test_class_names_are_unique_across_the_library():
    where = defaultdict(list)
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.ClassDef):
                where[node.name].append(f"{path.relative_to(LIBRARY)}:{node.lineno}")
    repeated = {name: places for name, places in where.items() if len(places) > 1}
    assert not repeated, f"class names defined more than once (rename one): {repeated}"
