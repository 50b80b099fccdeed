"""Issue 42, "the first hour, again": natural mistakes a new user makes on the command line are one `error:` line
each (exit 2, before any work), never a silent choice or a traceback."""

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "script, args, flag",
    [
        ("sft", ["--config", "recipes/tiny/sft.yaml", "--max_steps", "2", "--max_steps", "3"], "--max_steps"),
        ("sft", ["--config", "recipes/tiny/sft.yaml", "--learning_rate=1e-3", "--learning-rate", "2e-3"],
         "--learning-rate"),
        ("sizing", ["--model", "instella-3b", "--nodes", "2", "--nodes", "4"], "--nodes"),
    ],
)  # fmt: skip
def test_a_flag_given_twice_is_an_error_naming_it(script, args, flag, capsys, monkeypatch):
    """argparse keeps the last value silently; keys given twice in a recipe are already an error (core.recipe)."""
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:
        importlib.import_module(f"instella_recipes.scripts.{script}").main(args)
    assert done.value.code == 2
    line = _one_error_line(capsys)
    assert f"flag '{flag}' given twice" in line, line


def test_list_flags_given_twice_still_add_up():
    """`--stage a --stage b` is `--stage a b` (docs/slurm.md runs it so); only single-valued flags are refused."""
    from dataclasses import dataclass, field

    from instella_recipes.core.recipe import parse_recipe

    @dataclass
    class Probe:
        stage: list[str] = field(default_factory=list)

    (parsed,) = parse_recipe([Probe], ["--stage", "a", "--stage", "b"])
    assert parsed.stage == ["a", "b"]


def test_sft_max_length_past_the_models_positions_is_refused_before_work(tiny_model_dir, tmp_path, capsys):
    """RoPE computes any position, so SFT at `max_length` 300 on a 256-position model trained without a word; GRPO's
    prompt + completion cap had the check already (one check: trainer/checks.py check_fits_positions)."""
    from instella_recipes.post_training.sft import main

    out = tmp_path / "sft"
    argv = ["--config", str(ROOT / "recipes/tiny/sft.yaml"), "--model_name_or_path", str(tiny_model_dir)]
    with pytest.raises(SystemExit) as done:
        main([*argv, "--output_dir", str(out), "--max_length", "300"])
    assert done.value.code == 2
    line = _one_error_line(capsys)
    assert "max_length 300 = 300 tokens exceed the model's max_position_embeddings 256" in line, line
    assert "lower --max_length" in line and not out.exists()


SMALL = ["--max_samples", "8", "--per_device_train_batch_size", "4", "--global_batch_size", "4", "--max_steps", "1"]
SMALL += ["--report_to", "none", "--save_strategy", "no"]


@pytest.mark.usefixtures("one_thread")
def test_sft_started_as_a_script_records_its_command_line_and_recipe_and_the_card_names_them(
    tiny_model_dir, tmp_path, monkeypatch
):
    """`python scripts/sft.py ...` (argv from sys.argv) stored an empty command line and no recipe, so the release
    card could not name its recipe; a base model given as a Hub id is the card's `base_model`."""
    import json

    import yaml

    from instella_recipes.checkpoint.release import main as release
    from instella_recipes.core import read_manifest
    from instella_recipes.post_training.sft import main

    monkeypatch.chdir(ROOT)  # the documented way: recipes/... relative to the repository root
    out = tmp_path / "sft"
    args = ["--config", "recipes/tiny/sft.yaml", "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out)]
    monkeypatch.setattr("sys.argv", ["scripts/sft.py", *args, *SMALL])
    assert main() == 0
    manifest = read_manifest(out)
    assert manifest["recipe"] == "recipes/tiny/sft.yaml" and manifest["argv"] == [*args, *SMALL]
    assert manifest["recipe_sha256"]
    manifest["inputs"]["model"] = "amd/Instella-3B"  # as if the run had started from the Hub
    (out / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.chdir(tmp_path)  # the card finds the recipe from anywhere
    assert release(["--model_dir", str(out), "--output_dir", str(tmp_path / "rel")]) in (0, None)
    card = (tmp_path / "rel" / "README.md").read_text()
    assert "Trained with the recipe `" in card and "recipes/tiny/sft.yaml" in card
    assert yaml.safe_load(card.split("---")[1])["base_model"] == "amd/Instella-3B"


def test_ctrl_c_in_an_entry_point_is_one_line_and_exit_130(capsys):
    """KeyboardInterrupt out of a stage's main: no traceback, and the line says nothing was marked complete (the
    manifest is written last). The real signal during training: tests/e2e/test_first_hour_processes.py."""
    from instella_recipes.core import exit_on_recipe_error

    @exit_on_recipe_error
    def main(argv=None):
        assert argv == ["--from", "sys.argv"]  # a script's main gets the command line it ran with
        raise KeyboardInterrupt

    import sys

    saved, sys.argv = sys.argv, ["scripts/x.py", "--from", "sys.argv"]
    try:
        with pytest.raises(SystemExit) as done:
            main()
    finally:
        sys.argv = saved
    assert done.value.code == 130
    assert "interrupted (Ctrl-C): nothing was marked complete" in _one_error_line(capsys)


@pytest.mark.parametrize("local_rank, printed", [("0", True), ("5", False)])
def test_an_8_gpu_accelerate_config_on_cpu_is_one_line_from_the_first_node_process(
    local_rank, printed, capsys, monkeypatch
):
    """`accelerate launch --config_file accelerate_configs/ddp_8gpu.yaml scripts/pretrain.py ...` on a machine without
    a GPU: each of the 8 processes finds it; the first of the node says what to run instead, the others exit 2
    quietly (accelerate's launcher then reports the failed processes: its own summary, not ours)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("the message is for a machine without a GPU")
    from instella_recipes.pretraining.pretrain import main

    env = {"WORLD_SIZE": "8", "LOCAL_RANK": local_rank, "ACCELERATE_MIXED_PRECISION": "bf16"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit) as done:
        main(["--config", "recipes/amd-llama-135m/pretrain.yaml"])
    assert done.value.code == 2
    if printed:
        line = _one_error_line(capsys)
        assert "launched 8 processes with mixed precision bf16, a GPU config, on a machine without a GPU" in line
        assert "accelerate_configs/cpu_2proc.yaml" in line
    else:
        assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "script, extra, expected",
    [
        ("sft", ["--report_to", "tensorboard,wandb"], "report_to: wandb is not installed: pip install wandb"),
        ("pretrain", ["--report_to", "wandb"], "report_to: wandb is not installed: pip install wandb"),
        ("sft", ["--attn_implementation", "flash_attention_2"], "attn_implementation flash_attention_2 needs a GPU"),
        ("pretrain", ["--attn_implementation", "flash_attention_2"], "flash_attention_2 needs a GPU"),
    ],
)
def test_missing_integrations_and_gpu_only_attention_are_one_line_before_work(
    script, extra, expected, tmp_path, capsys, monkeypatch
):
    """transformers raised these as tracebacks once the model and data had loaded."""
    import importlib.util

    import torch

    if "wandb" in expected and importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    if "GPU" in expected and torch.cuda.is_available():
        pytest.skip("the message is for a machine without a GPU")
    recipe = {"sft": "recipes/tiny/sft.yaml", "pretrain": "recipes/tiny/pretrain_stage1.yaml"}[script]
    monkeypatch.chdir(ROOT)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as done:
        importlib.import_module(f"instella_recipes.scripts.{script}").main(
            ["--config", recipe, "--output_dir", str(out), *extra]
        )
    assert done.value.code == 2
    assert expected in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--tasks", "nosuch"], "--tasks after `--` bypasses evaluate.py's checks: give it as evaluate.py's --tasks"),
        (["--model=vllm"], "--model after `--` bypasses evaluate.py's checks: give it as evaluate.py's --backend"),
        (["--log_samples"], "--log_samples writes the samples beside the results: add --output_path"),
    ],
)
def test_evaluate_refuses_lm_eval_arguments_it_cannot_check(extra, expected, tiny_model_dir, capsys):
    """`evaluate.py ... -- --tasks nosuch` went past the task check to lm-eval's "Tasks not found" traceback."""
    from instella_recipes.evaluation.preflight import main

    with pytest.raises(SystemExit) as done:
        main(["--model_dir", str(tiny_model_dir), "--tasks", "tiny_world", "--", *extra])
    assert done.value.code == 2
    assert expected in _one_error_line(capsys)


def test_a_recipe_path_typed_outside_the_repository_root_says_where_paths_start(tmp_path, monkeypatch, capsys):
    """From another folder, `--config recipes/tiny/sft.yaml` was answered "did you mean --config
    recipes/tiny/sft.yaml?": exactly what was typed."""
    from instella_recipes.core.command_line import preflight

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["scripts/sft.py", "--config", "recipes/tiny/sft.yaml"])
    with pytest.raises(SystemExit) as done:
        preflight("sft", "recipes/tiny/sft.yaml")
    assert done.value.code == 2
    line = _one_error_line(capsys)
    assert f"does not exist here ({tmp_path})" in line and f"cd {ROOT} first" in line
    assert "did you mean" not in line
