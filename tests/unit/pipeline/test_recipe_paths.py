"""The recipes connect: every stage input a recipe names (a model folder, packed data, a corpus file) is the output
of some recipe or pipeline stage, in one scheme: `runs/<run>/<stage>` with the stage names of the run's pipeline
(`runs/demo/...` for the tiny model, which `make demo` makes; `runs/instella-3b/...` for the published run). So the
documented commands, the pipeline and `make demo` read the same folders; the tiny recipes run by hand write theirs
beside the demo's (`runs/tiny/<stage>`), never into them."""

from functools import cache
from pathlib import Path

import pytest
import yaml

from instella_recipes.core import fill_placeholders
from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.weights import looks_like_hub_id

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml") if p.name != "pipeline.yaml")
PIPELINES = sorted((ROOT / "recipes").rglob("pipeline.yaml"))
SEEDS = (5796, 6198, 8915)  # the stage-2 seeds a `{seed}` output_dir is formatted with
INPUT_KEYS = ("model_name_or_path", "data_dir", "data_root", "corpus", "tokenizer", "tokenizer_name_or_path", "inputs")
# Raw downloads a user prepares by hand (docs/pretraining.md), not stage outputs.
RAW_INPUTS = ("data/raw/",)


def _recipe(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


@cache  # read once for the whole module: each recipe's case looks its inputs up in it
def _outputs() -> dict[str, str]:
    """Every output folder -> what writes it (a recipe's output_dir, each seed formatted; each pipeline stage)."""
    out = {}
    for path in RECIPES:
        target = _recipe(path).get("output_dir")
        if isinstance(target, str):
            for seed in SEEDS if "{seed}" in target else (None,):
                folder = fill_placeholders(target, {"seed": seed}, str(path)) if seed else target  # as pretrain does
                out[folder] = path.relative_to(ROOT).as_posix()
    for path in PIPELINES:
        pipeline = load_pipeline(path)
        for stage in pipeline.stages:
            out[pipeline.output_of(stage).as_posix()] = f"{path.relative_to(ROOT).as_posix()} stage {stage.name}"
    return out


def _local_inputs(data: dict) -> list[str]:
    """The local paths a recipe reads from other stages: input keys and `sources[].path` (Hub ids excluded)."""
    values = []
    for key in INPUT_KEYS:
        value = data.get(key)
        values += value if isinstance(value, list) else [value]
    values += [s.get("path") for s in data.get("sources") or [] if isinstance(s, dict)]
    return [
        v
        for v in values
        if isinstance(v, str) and v and not looks_like_hub_id(v) and not v.startswith(RAW_INPUTS) and "<" not in v
        and not _shipped(v)
    ]  # fmt: skip


def _shipped(value: str) -> bool:
    """A file the repository ships with the recipes (the authors' tokenizer, token-file lists), not a stage output."""
    path = ROOT / value
    return path.is_file() and path.is_relative_to(ROOT / "recipes")


@pytest.mark.parametrize("path", RECIPES, ids=[p.relative_to(ROOT / "recipes").as_posix() for p in RECIPES])
def test_every_recipe_input_is_some_recipes_output(path):
    outputs = _outputs()
    for value in _local_inputs(_recipe(path)):
        # a file inside an output folder (runs/demo/data/corpus.jsonl) counts as that folder's
        owners = [folder for folder in outputs if value == folder or value.startswith(folder + "/")]
        assert owners, f"{path.relative_to(ROOT)}: input {value} is the output of no recipe or pipeline stage"


def _by_hand(folder: Path) -> str:
    """Where a recipe run by hand writes the folder its pipeline stage writes: the same, except the demo's
    (`runs/demo/<stage>`): the tiny recipes write beside it, `runs/tiny/<stage>` (issue 42: a documented tiny command
    after `make demo` found the demo's own complete output in its way, or would have written into the demo)."""
    parts = folder.parts
    return Path("runs", "tiny", *parts[2:]).as_posix() if parts[:2] == ("runs", "demo") else folder.as_posix()


def test_recipe_outputs_use_the_pipeline_stage_folders():
    """A recipe that a pipeline stage runs writes, when run by hand, the folder that stage writes (the tiny ones:
    beside the demo, `_by_hand`)."""
    for path in PIPELINES:
        pipeline = load_pipeline(path)
        for stage in pipeline.stages:
            if not stage.recipe:
                continue
            target = _recipe(ROOT / stage.recipe).get("output_dir")
            values = stage.values or {}
            assert target and target.format(**values) == _by_hand(pipeline.output_of(stage)), (
                f"{stage.recipe} writes {target}, its stage {stage.name} in {path.relative_to(ROOT)} writes "
                f"{pipeline.output_of(stage)}"
            )


def test_documented_commands_use_the_same_folders():
    """A `runs/demo/...` or `runs/instella-3b/...` path a documented command reads is a stage folder (or a file in
    one), or the run's own logs/report, as the recipes and pipelines write them. (Where a command writes is its
    own choice.)"""
    from tests.unit.repo.test_documented_commands import documented_commands

    outputs = {tuple(Path(folder).parts[:3]) for folder in _outputs()}
    run_files = {"logs", "pipeline", "report", "report.md"}
    for where, argv in documented_commands():
        for before, token in zip(["", *argv], argv):
            if not token.startswith(("runs/demo/", "runs/instella-3b/")) or before in ("--output_dir", "--output"):
                continue
            for path in _expand_braces(token):
                parts = Path(path).parts
                assert parts[:3] in outputs or parts[2] in run_files, f"{where}: {path} is written by no stage"


def _expand_braces(token: str) -> list[str]:
    """`stage2_{1,2}` -> `stage2_1`, `stage2_2` (bash brace expansion, one group)."""
    if "{" not in token or "," not in token:
        return [token]
    head, rest = token.split("{", 1)
    body, tail = rest.split("}", 1)
    return [head + item + tail for item in body.split(",")]


def test_every_demo_stage_runs_with_one_thread():
    """Issue 32: the demo's stages that the tiny training recipes do not cover (lm-eval, the speculative benchmark)
    ran with torch's default threads, 10x slower on a loaded machine: every stage gets OMP_NUM_THREADS=1, and a stage
    whose recipe sets torch_num_threads sets 1."""
    pipeline = load_pipeline(ROOT / "recipes" / "tiny" / "pipeline.yaml")
    for stage in pipeline.stages:
        assert stage.resolved.env.get("OMP_NUM_THREADS") == "1", stage.name
        if stage.recipe:
            assert _recipe(ROOT / stage.recipe).get("torch_num_threads", 1) == 1, stage.name
