"""Tiny SFT end to end (loss falls, the held-out answer format is learned, the output folder is complete), and
padding-free packing giving the same per-token loss as one padded example per row."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.post_training import sft
from instella_recipes.post_training.template import install_chat_template

TINY_SFT = str(Path(__file__).resolve().parents[3] / "recipes" / "tiny" / "sft.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")


def recipe(model_dir, out, *extra):
    argv = ["--config", TINY_SFT, "--model_name_or_path", str(model_dir), "--output_dir", str(out), *extra]
    return argv, parse_recipe([sft.CheckedSFTConfig, ModelConfig], argv)


def _loss(trainer, examples):
    trainer.model.eval()
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, trainer.data_collator(examples)).item()


def test_packed_and_padded_give_the_same_per_token_loss(tiny_model_dir, tmp_path):
    """Same examples, same model: the published layout (each row padded to max_length) and TRL's padding-free
    packing (examples concatenated, positions restart per example, no attention across examples) agree."""
    _, parsed = recipe(tiny_model_dir, tmp_path / "a", "--max_samples", "24", "--pad_to_multiple_of", "256")
    padded, _ = sft.build_trainer(*parsed)
    _, parsed = recipe(tiny_model_dir, tmp_path / "b", "--max_samples", "24", "--packing", "true")
    packed, _ = sft.build_trainer(*parsed)
    packed.model.load_state_dict(padded.model.state_dict())

    rows = [padded.train_dataset[i] for i in range(24)]
    batch = padded.data_collator(rows)
    assert batch["input_ids"].shape == (24, 256) and (batch["input_ids"] == 1).sum() > 0.5 * batch["input_ids"].numel()
    packs = [packed.train_dataset[i] for i in range(len(packed.train_dataset))]
    assert len(packs) < len(rows) and sum(len(p["seq_lengths"]) for p in packs) == 24
    flat = packed.data_collator(packs)
    assert flat["input_ids"].shape[0] == 1 and "attention_mask" not in flat
    n_trained = (batch["labels"] != -100).sum()
    assert (flat["labels"] != -100).sum() == n_trained
    torch.testing.assert_close(
        torch.tensor(_loss(packed, packs)), torch.tensor(_loss(padded, rows)), rtol=1e-5, atol=1e-5
    )


def test_padding_free_without_packing_builds_and_gives_the_padded_loss(tiny_model_dir, tmp_path):
    """`padding_free: true` alone (each batch flattened into one row, one example per document): SFTTrainer refuses
    a max_length it would not enforce, so the stage builds it without one after cutting the rows itself; the recipe's
    max_length stays in the run's settings, and the flattened batch gives the padded batch's per-token loss."""
    _, parsed = recipe(tiny_model_dir, tmp_path / "a", "--max_samples", "16")
    padded, _ = sft.build_trainer(*parsed)
    _, parsed = recipe(tiny_model_dir, tmp_path / "c", "--max_samples", "16", "--padding_free", "true")
    flat, _ = sft.build_trainer(*parsed)
    assert flat.args.max_length == 256 and flat.args.padding_free and not flat.args.packing  # the recipe's, kept
    assert max(len(flat.train_dataset[i]["input_ids"]) for i in range(16)) <= 256  # cut by the stage (overlong)
    flat.model.load_state_dict(padded.model.state_dict())
    rows = [padded.train_dataset[i] for i in range(16)]
    batch = flat.data_collator([flat.train_dataset[i] for i in range(16)])
    assert batch["input_ids"].shape[0] == 1 and "attention_mask" not in batch
    torch.testing.assert_close(
        torch.tensor(_loss(flat, [flat.train_dataset[i] for i in range(16)])),
        torch.tensor(_loss(padded, rows)),
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.gpu
def test_packed_and_padded_agree_with_flash_attention(tiny_model_dir):
    """On GPU the padding-free batch goes through flash-attn varlen (cu_seq_lens from TRL's collator)."""
    from transformers.utils import is_flash_attn_2_available
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    if not torch.cuda.is_available() or not is_flash_attn_2_available():
        pytest.skip("needs a CUDA/ROCm GPU with flash-attn installed")
    from datasets import Dataset

    from instella_recipes.data.tiny_world import TinyWorld
    from instella_recipes.post_training.tokenization import prepare_sft_dataset

    tokenizer = install_chat_template(load_tokenizer(tiny_model_dir))
    rows, _ = prepare_sft_dataset(Dataset.from_list(TinyWorld().sft()[:16]), tokenizer, max_length=256)
    rows = [rows[i] for i in range(len(rows))]
    model = AutoModelForCausalLM.from_pretrained(
        tiny_model_dir, dtype=torch.bfloat16, attn_implementation="flash_attention_2"
    ).cuda()
    losses = []
    for padding_free in (False, True):
        batch = DataCollatorForLanguageModeling(pad_token_id=1, padding_free=padding_free)(rows)
        batch = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        with torch.no_grad():
            losses.append(model(**batch).loss.float().item())
    assert losses[0] == pytest.approx(losses[1], rel=2e-2)
