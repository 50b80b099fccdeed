"""Long-context SFT settings, in process: sequence parallelism needs padding-free rows that split evenly, and a
launch that can hold it; `rope_theta` must be the input model's; the recipes/instella-3b-long/sft.yaml numbers.
The 2-process run: tests/e2e/test_sft_sequence_parallel.py."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.data import mds
from instella_recipes.post_training import sft
from instella_recipes.post_training.shared import CheckedModelConfig
from tests.unit.post_training import test_sft_train as unit_half
from tests.unit.post_training.test_instella_math_sft2 import assert_gradient_is, one_sft_update

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"sequence_parallel_size": 2}, "takes padding-free rows: set packing: true"),
        (
            {"sequence_parallel_size": 2, "packing": "true", "pad_to_multiple_of": 3},
            "pad_to_multiple_of 3 is not divisible by",
        ),
        (
            {"sequence_parallel_size": 2, "packing": "true", "pad_to_multiple_of": 2},
            "does not divide the world size (1 processes)",
        ),
        ({"rope_theta": 514640}, "rope_theta 514640 (recipe) but model_name_or_path"),
        ({"loss_reduction": "all"}, "loss_reduction must be one of ('mean', 'sum', 'input_tokens')"),
        ({"loss_normalizer": "input_tokens"}, "unknown flag '--loss_normalizer' (the loss divisor is one key"),
        ({"optimizer_state_from": "/nonexistent/phase2"}, "/nonexistent/phase2/optimizer_state holds no optimizer"),
    ],
)
def test_bad_long_sft_inputs_are_one_line(tiny_model_dir, tmp_path, capsys, overrides, message):
    argv = ["--config", unit_half.TINY_SFT, "--model_name_or_path", str(tiny_model_dir),
            "--output_dir", str(tmp_path / "out"), "--max_steps", "1"]  # fmt: skip
    for key, value in overrides.items():
        argv += [f"--{key}", str(value)]
    with pytest.raises(SystemExit) as exc:
        sft.main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_the_long_sft_recipe_has_the_published_numbers():
    args, _ = parse_recipe(
        [sft.CheckedSFTConfig, CheckedModelConfig],
        ["--config", "recipes/instella-3b-long/sft.yaml", "--use_cpu", "true", "--bf16", "false"],
    )
    assert (args.learning_rate, args.warmup_steps, args.max_steps, args.max_length) == (4e-5, 13, 250, 262_144)
    assert args.lr_scheduler_kwargs == {"alpha_f": 0.001} and str(args.lr_scheduler_type.value) == "linear"
    assert (args.sequence_parallel_size, args.sequence_parallel_mode, args.force_sequence_parallel) == (
        4,
        "authors",
        True,
    )
    assert args.loss_reduction == "input_tokens" and not args.average_tokens_across_devices  # per device, L872
    streams = mds.parse_streams(args.mds_streams, args.data_root)  # data.paths L110-116
    assert {folder.name: p for folder, p in streams} == {
        "books": 0.44, "dclm": 0.1, "arxiv": 0.06, "ultrachat-200k-packed": 0.25, "openmathinstruct2-packed": 0.1,
        "mmlu-auxiliary-train-packed": 0.03, "tulu3-personas-packed": 0.02,
    }  # fmt: skip
    assert {folder.parent for folder, _ in streams} == {Path("data/raw/Instella-Long/sft")} and not args.sources
    assert args.num_canonical_nodes == 2  # streaming's default on their 8 nodes with replication 4 (SP)
    assert not args.packing and args.max_length % args.sequence_parallel_size == 0
    assert args.rope_theta == 3_691_950
    assert args.optimizer_state_from == "runs/instella-3b-long/phase2"  # moments kept, step and schedule reset
    assert (args.per_device_train_batch_size, args.global_batch_size) == (1, 16)  # 64 GPUs / SP 4 = 16 rows
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.weight_decay, args.max_grad_norm) == (
        0.9, 0.95, 1e-8, 0.1, 1.0,
    )  # fmt: skip


def test_a_recipe_with_the_retired_loss_normalizer_key_is_told_the_new_one(tmp_path):
    recipe = tmp_path / "sft.yaml"
    recipe.write_text(f"model_name_or_path: x\noutput_dir: {tmp_path / 'out'}\nloss_normalizer: input_tokens\n")
    with pytest.raises(RecipeError, match=r"sft.yaml:3: unknown key 'loss_normalizer' \(.*loss_reduction: input_"):
        parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], ["--config", str(recipe)])


def test_input_token_loss_divides_by_every_input_token(tiny_model_dir, tmp_path):
    """`loss_reduction: input_tokens`: one update's gradient is the summed token CE of the step's rows over all their
    input tokens, masked prompt tokens too (the authors' `batch["input_ids"].numel() / seq_parallel_size`, SP 1)."""
    flags = ("--loss_reduction", "input_tokens", "--average_tokens_across_devices", "false")
    rows, grads = one_sft_update(tiny_model_dir, tmp_path, *flags)
    tokens = sum(row["input_ids"].numel() for row in rows)
    assert tokens > sum(int((row["labels"] != -100).sum()) for row in rows)  # the prompts count too
    assert_gradient_is(tiny_model_dir, rows, grads, divisor=tokens)


@pytest.mark.parametrize("reduction, expected", [("input_tokens", 12 / 2), ("sum", 1 / 2)])
def test_sequence_parallel_divides_the_reductions_count_by_its_size(reduction, expected):
    """The SFT trainer's one divisor: `loss_reduction`'s count (two micro-batches of 8 and 4 input tokens, or 1 for
    sum), then / SP size 2 (the ranks of an SP group count the same rows); the 2-process run that depends on it:
    tests/e2e/test_sft_sequence_parallel.py."""
    trainer = object.__new__(sft.InstellaSFTTrainer)  # the hook's state only, no model or data
    trainer.loss_reduction, trainer.sequence_parallel = reduction, SimpleNamespace(size=2)
    trainer.count_label_positions = False  # SFT's rows mask labels: the device's input_ids are counted
    rows = [{"input_ids": torch.ones(1, n, dtype=torch.long), "labels": torch.full((1, n), -100)} for n in (8, 4)]
    assert float(trainer._get_num_items_in_batch(rows, torch.device("cpu"))) == expected
