"""Instella-Math SFT stage 1 exact to the authors: OpenMathInstruct-2 rows equal `scripts/prepare_sft_data.py`'s
(copied test-only into tests/helpers/instella_sft_oracle.py) token by token, ids and labels, at 4096 and cut short;
and the recipe carries configs/instella-3b-sft-math-stage1.yaml's settings (AMD-AIG-AIMA/Instella f00a236)."""

from pathlib import Path

import pytest
from datasets import Dataset
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from instella_recipes.core import parse_recipe
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.post_training import converters
from instella_recipes.post_training.sft import CheckedSFTConfig
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.post_training.tokenization import prepare_sft_dataset
from instella_recipes.trainer.features.optimizer import olmo_lr_factor
from tests.conftest import OLMO_TOKENIZER
from tests.helpers import instella_sft_oracle as authors

RECIPES = Path(__file__).resolve().parents[3] / "recipes" / "instella-3b-math"

# OpenMathInstruct-2 rows (`problem`, `generated_solution`, plus the columns the converters ignore), handmade
ROWS = [
    {"problem": "What is $2+3$?", "generated_solution": "We add: $2+3=5$.\n\nThe answer is $\\boxed{5}$."},
    {"problem": "  Solve $x^2=4$ for $x>0$.\n", "generated_solution": "\n $x=2$, so $\\boxed{2}$. \n\n"},
    {"problem": "Compute $\\frac{1}{2}+\\frac{1}{3}$.", "generated_solution": "$\\boxed{\\frac{5}{6}}$"},
    {"problem": "Café ½ → ∑ 日本語\ttab", "generated_solution": "Unicode: ∞ ≤ √2 ≈ 1.414 so \\boxed{\\sqrt{2}}"},
    {"problem": "Empty answer?", "generated_solution": "   "},
    {"problem": "long " * 50, "generated_solution": "step " * 40 + "\\boxed{1}"},
    {"problem": "long " * 80, "generated_solution": "never labelled"},
]
for row in ROWS:
    row.update(expected_answer="5", problem_source="augmented_math")


def _authors_rows(max_len: int) -> list[dict]:
    tokenizer = authors.Tokenizer(OLMO_TOKENIZER, eos_token_id=0, pad_token_id=1)
    converted = authors.convert_openmathinstruct(ROWS)
    rows = [authors.preprocess(example, tokenizer=tokenizer, max_seq_len=max_len) for example in converted]
    return [row for row in rows if authors.filter(row)]


@pytest.mark.parametrize("max_length", [4096, 64])
def test_openmathinstruct2_rows_equal_prepare_sft_data(max_length):
    expected = _authors_rows(max_length)
    tok = install_chat_template(load_tokenizer(OLMO_TOKENIZER))
    dataset = Dataset.from_list([converters.openmathinstruct2(row, i) for i, row in enumerate(ROWS)])
    kept, report = prepare_sft_dataset(dataset, tok, max_length)
    assert report.kept == len(expected) == len(ROWS) - (max_length < 100)
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, pad_to_multiple_of=max_length)(
        [dict(row) for row in kept]
    )
    assert batch["input_ids"].shape == (len(expected), max_length)
    assert batch["input_ids"].tolist() == [row["input_ids"] for row in expected]
    authors_labels = [[t if m else -100 for t, m in zip(r["input_ids"], r["label_mask"])] for r in expected]
    assert batch["labels"].tolist() == authors_labels
    assert expected[0]["input_ids"][0] == 0 and expected[0]["label_mask"][0] is False  # eos first, unlabelled


def _parse(name: str):
    # the stage lifecycle (i31) has one settings object: the recipe fields live in CheckedSFTConfig
    t, model = parse_recipe(
        [CheckedSFTConfig, CheckedModelConfig], ["--config", str(RECIPES / name), "--bf16", "false"]
    )
    return t, t, model


def test_sft_stage1_recipe_is_the_authors_config():
    args, t, _ = _parse("sft_stage1.yaml")
    assert args.sources == [{"path": "nvidia/OpenMathInstruct-2", "split": "train", "converter": "openmathinstruct2"}]
    assert (t.max_length, t.pad_to_multiple_of, t.packing, t.num_train_epochs) == (4096, 4096, False, 3)
    assert args.global_batch_size == 128 == t.per_device_train_batch_size * t.gradient_accumulation_steps * 8
    assert (t.learning_rate, t.adam_beta1, t.adam_beta2, t.adam_epsilon) == (2e-5, 0.9, 0.95, 1e-8)
    assert (t.weight_decay, t.max_grad_norm, t.seed) == (0.1, 1.0, 6198)
    assert t.average_tokens_across_devices is False  # normalize_by_label_mask: per device batch
    assert t.dataloader_drop_last
    # linear_with_warmup, t_warmup 500, alpha_f 0.001: from 0.1 x peak, to 0.001 x peak at the last step
    assert t.warmup_steps == 500 and t.lr_scheduler_kwargs == {"alpha_f": 0.001}
    factor = dict(warmup_steps=500, total_steps=10_000, decay=str(t.lr_scheduler_type.value), alpha_f=0.001)
    assert olmo_lr_factor(0, **factor) == pytest.approx(0.1)
    assert olmo_lr_factor(500, **factor) == pytest.approx(1.0)
    assert olmo_lr_factor(10_000, **factor) == pytest.approx(0.001)
    assert olmo_lr_factor(5250, **factor) == pytest.approx(0.001 + 0.999 * 0.5)
