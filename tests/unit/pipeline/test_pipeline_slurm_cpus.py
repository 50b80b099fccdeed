"""The Slurm executor gives a stage the CPUs its own settings ask for (`num_proc` in its args or recipe), unless its
`slurm:` or `--slurm` says otherwise: the prepare stages asked for 32 worker processes and were given 1 CPU."""

from instella_recipes.pipeline.graph import load_pipeline
from instella_recipes.pipeline.slurm import resources


def _pipeline(tmp_path, stage_extra: str = "", slurm: str = ""):
    recipe = tmp_path / "prepare.yaml"
    recipe.write_text("# CPU node\nlayout: olmo\nnum_proc: 32\n")
    path = tmp_path / "pipeline.yaml"
    path.write_text(
        f"# CPU nodes\noutput_dir: {tmp_path / 'run'}\n{slurm}stages:\n"
        f"  - {{name: prep, command: scripts/prepare_data.py, recipe: {recipe}, args: {{output_dir: '{{output}}'"
        f"{stage_extra}}}}}\n"
    )
    return load_pipeline(path, tmp_path / "run")


def test_a_stage_gets_the_cpus_its_recipe_asks_for(tmp_path):
    pipeline = _pipeline(tmp_path)
    assert resources(pipeline, pipeline.stage("prep"), [])["cpus_per_task"] == 32


def test_the_stage_args_then_its_slurm_section_then_the_flags_win(tmp_path):
    pipeline = _pipeline(tmp_path, ", num_proc: 64")
    stage = pipeline.stage("prep")
    assert resources(pipeline, stage, [])["cpus_per_task"] == 64
    assert resources(pipeline, stage, ["prep.cpus_per_task=8"])["cpus_per_task"] == 8
    pipeline = _pipeline(tmp_path, slurm="slurm: {cpus_per_task: 4}\n")
    assert resources(pipeline, pipeline.stage("prep"), [])["cpus_per_task"] == 4


def test_a_prepare_stage_that_submits_its_own_array_runs_on_one_cpu(tmp_path):
    pipeline = _pipeline(tmp_path, ", executor: slurm, tasks: 9, num_proc: 64")
    assert resources(pipeline, pipeline.stage("prep"), [])["cpus_per_task"] == 1
