"""Every pipeline we ship is consistent before anything runs: for each stage, the accelerate config's process count
x per-device batch x gradient accumulation (recipe, then the stage's args) equals the recipe's published
`global_batch_size` (the entry points refuse a launch where it does not; with sequence parallelism the processes of
one SP group share a row, so the count is over the processes / `sequence_parallel_size`); and a stage that continues
another's AdamW state reads it from a stage whose recipe writes it."""

from pathlib import Path

import pytest
import yaml

from instella_recipes.pipeline.graph import load_pipeline

ROOT = Path(__file__).resolve().parents[3]
PIPELINES = sorted(ROOT.glob("recipes/*/pipeline.yaml"))
BATCH_KEYS = (
    "global_batch_size",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "sequence_parallel_size",
)


def _recipe(pipeline, stage) -> dict:
    """The recipe a stage runs: its file with `recipe_overrides`, then the stage's `args` flags on top."""
    text = stage.resolved.recipe_text or stage.resolved.recipe_file.read_text()
    values = yaml.safe_load(text) or {}
    if isinstance(stage.args, dict):
        keys = (*BATCH_KEYS, "model_name_or_path", "optimizer_state_from")
        values.update({k: v for k, v in stage.args.items() if k in keys})
    return values


def _processes(stage) -> int:
    if not stage.accelerate_config:
        return 1  # the runner starts the command as one plain process
    return int(yaml.safe_load((ROOT / stage.accelerate_config).read_text()).get("num_processes", 1))


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.parent.name)
def test_every_stage_launch_gives_the_published_global_batch(path, tmp_path):
    pipeline = load_pipeline(path, output_dir=tmp_path)
    checked = []
    for stage in pipeline.stages:
        if not stage.recipe:
            continue
        recipe = _recipe(pipeline, stage)
        if recipe.get("global_batch_size") is None:
            continue
        product = (
            _processes(stage)
            * int(recipe.get("per_device_train_batch_size", 8))  # transformers' default
            * int(recipe.get("gradient_accumulation_steps", 1))
            // int(recipe.get("sequence_parallel_size", 1))
        )
        assert product == int(recipe["global_batch_size"]), (
            f"{path.name} stage '{stage.name}': {stage.accelerate_config or '1 process'} x per-device "
            f"{recipe.get('per_device_train_batch_size')} x accumulation {recipe.get('gradient_accumulation_steps')} "
            f"= {product}, but {stage.recipe} publishes {recipe['global_batch_size']}"
        )
        checked.append(stage.group)
    assert checked  # every shipped pipeline has stages with a published batch
    if path.parent.name == "instella-3b":
        assert {"stage1", "stage2", "sft", "dpo"} <= set(checked)


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.parent.name)
def test_optimizer_state_is_written_where_a_later_stage_reads_it(path, tmp_path):
    pipeline = load_pipeline(path, output_dir=tmp_path)
    readers = [s for s in pipeline.stages if s.recipe and _recipe(pipeline, s).get("load_optimizer_state")]
    if path.parent.name == "instella-3b":  # the three stage-2 runs keep stage 1's AdamW moments (SPEC.md 2.1)
        assert {s.group for s in readers} == {"stage2"} and len(readers) == 3
    continuing = [s for s in pipeline.stages if s.recipe and _recipe(pipeline, s).get("optimizer_state_from")]
    for stage in continuing:  # another run's state, beside a model folder of its own (Instella-Long phase 2)
        source = stage.args.get("optimizer_state_from", "")
        producer = next(s for s in pipeline.stages if source == f"{{{s.group}}}" or source == f"{{{s.name}}}")
        assert _recipe(pipeline, producer).get("save_optimizer_state"), (stage.name, producer.name)
    for stage in readers:
        source = stage.args.get("model_name_or_path", "")
        producer = next(s for s in pipeline.stages if source == f"{{{s.group}}}" or source == f"{{{s.name}}}")
        assert _recipe(pipeline, producer).get("save_optimizer_state"), (
            f"stage '{stage.name}' continues the AdamW state of '{producer.name}', whose recipe does not save it"
        )
