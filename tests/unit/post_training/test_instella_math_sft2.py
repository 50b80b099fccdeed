"""Instella-Math SFT stage 2 exact to the authors' open-instruct run: rows equal `encode_sft_example` with the
tulu template + BOS (copied test-only into tests/helpers/open_instruct_oracle.py), the English-only rule equals
`prepare_ammath_dataset.py`'s `is_english`, the summed loss gives open-instruct's gradient, and the recipe carries
their config (AMD-AIG-AIMA/Instella-Math 65534d3)."""

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from langdetect import DetectorFactory
from transformers import AutoModelForCausalLM, TrainerCallback
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.post_training import converters, sft
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.post_training.tokenization import prepare_sft_dataset
from tests.conftest import OLMO_TOKENIZER
from tests.helpers import open_instruct_oracle as authors

RECIPES = Path(__file__).resolve().parents[3] / "recipes"


def _am_row(question: str, answer: str, system: str | None = None) -> dict:
    info = {"source": "x", "reference_answer": "1", "test_case": None, "think_content": "t", "answer_content": "a"}
    head = [{"role": "system", "content": system, "info": info}] if system is not None else []
    return {
        "messages": head
        + [{"role": "user", "content": question, "info": info}, {"role": "assistant", "content": answer, "info": info}]
    }


CONVERSATIONS = [
    _am_row("What is 2 + 3?", "<think>\nAdd them.\n</think>\n<answer>\n2 + 3 = \\boxed{5}\n</answer>"),
    _am_row("  Leading and trailing spaces  \n", " starts with a space and ends with newlines\n\n"),
    _am_row("Q", "A", system="You are a helpful assistant."),
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                  {"role": "user", "content": "Solve x+1=2."}, {"role": "assistant", "content": " x = 1"}]},
    _am_row("Café naïve ½ → ∑ 日本語\ttabs", "Unicode ∞ ≤ √2"),
    _am_row("long " * 40, "cut " * 40),  # cut inside the answer at 64
    _am_row("long " * 80, "never labelled at 64"),
]  # fmt: skip


def _authors_rows(max_len: int):
    hf = load_tokenizer(OLMO_TOKENIZER)
    oracle = authors.ChatTokenizer(hf, "{{ bos_token }}" + authors.TULU_TEMPLATE)
    rows = []
    for row in CONVERSATIONS:
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        encoded = authors.encode_sft_example({"messages": messages}, oracle, max_len)
        if (encoded["labels"] != -100).any():  # finetune.py L744
            rows.append(encoded)
    return rows


@pytest.mark.parametrize("max_length", [32768, 64])
def test_rows_equal_open_instructs_encode_sft_example(max_length):
    expected = _authors_rows(max_length)
    tok = install_chat_template(load_tokenizer(OLMO_TOKENIZER))
    dataset = Dataset.from_list([converters.am_deepseek_r1_distilled(r, i) for i, r in enumerate(CONVERSATIONS)])
    kept, report = prepare_sft_dataset(dataset, tok, max_length, row_format="open_instruct")
    assert report.kept == len(expected) == len(CONVERSATIONS) - (max_length < 100)
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id)([dict(row) for row in kept])
    for i, row in enumerate(expected):
        n = len(row["input_ids"])
        assert batch["input_ids"][i, :n].tolist() == row["input_ids"].tolist()
        assert batch["labels"][i, :n].tolist() == row["labels"].tolist()
        assert (batch["labels"][i, n:] == -100).all()
    assert expected[0]["input_ids"][0] == tok.bos_token_id == 0  # BOS first (add_bos)
    multi = expected[3]["labels"]  # both assistant turns of the two-turn chat are labelled
    assert (multi != -100).sum() > len(tok(" x = 1<|endoftext|>")["input_ids"])


ENGLISH_RULE_QUESTIONS = [
    "Find all real x such that x^2 - 5x + 6 = 0.",
    "已知函数 f(x) = x^2，求 f(3) 的值。",
    "Quelle est la somme des angles d'un triangle ?",
    "Berechnen Sie die Ableitung von sin(x) nach x.",
    "Сколько будет два плюс два?",
    "12345 + 67890 = ?",
    "",
    "$$\\int_0^1 x\\,dx$$",
    "Write a Python function that reverses a string.",
    "¿Cuántos lados tiene un hexágono?",
    "Let $a$ and $b$ be positive reals with $a+b=1$. Prove that $ab \\le 1/4$.",
    "日本の首都はどこですか？",
]


def test_english_rule_equals_prepare_ammath_dataset():
    for question in ENGLISH_RULE_QUESTIONS:
        row = _am_row(question, "a")
        DetectorFactory.seed = 0  # theirs is unseeded; the same seed on both sides compares the rule itself
        theirs = authors.is_english(row)
        assert converters.first_message_is_english(row) == theirs, question
    kept = [q for q in ENGLISH_RULE_QUESTIONS if converters.first_message_is_english(_am_row(q, "a"))]
    assert ENGLISH_RULE_QUESTIONS[0] in kept and ENGLISH_RULE_QUESTIONS[1] not in kept


def test_am_source_keeps_only_english_rows(tmp_path):
    from instella_recipes.post_training.mixture import build_mixture

    path = tmp_path / "am.jsonl"
    Dataset.from_list([_am_row(q, "a") for q in ENGLISH_RULE_QUESTIONS[:3]]).to_json(path)
    mixed, report = build_mixture([{"path": str(path), "converter": "am_deepseek_r1_distilled"}])
    assert report[0]["rows"] == 1 and mixed[0]["messages"][0]["content"] == ENGLISH_RULE_QUESTIONS[0]
    assert mixed[0]["messages"][0].get("info") is None  # (datasets keeps the column's struct; the values are gone)


class _Grads(TrainerCallback):
    def __init__(self, record):
        self.record = record

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.record["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def one_sft_update(model_dir, tmp_path, *flags: str) -> tuple[list[dict], dict]:
    """One update through the SFT trainer, 1 row per micro-batch x 2 accumulation steps on two rows of unequal
    length: (the rows as the loss saw them, the gradients the optimizer received)."""
    data = tmp_path / "chats.jsonl"
    answers = ["5.", "It is five, because two plus three makes five. " * 3]
    Dataset.from_list([_am_row(f"What is 2 + 3? ({i})", a) for i, a in enumerate(answers)]).to_json(data)
    argv = [
        "--model_name_or_path", str(model_dir), "--output_dir", str(tmp_path / "run"),
        "--sources", f"{{path: {data}, converter: am_deepseek_r1_distilled}}", "--row_format", "open_instruct",
        "--per_device_train_batch_size", "1", "--gradient_accumulation_steps", "2", "--max_steps", "1",
        "--learning_rate", "1e-3", "--max_grad_norm", "0", "--max_length", "128", "--use_cpu", "true",
        "--bf16", "false", "--report_to", "none", "--save_strategy", "no", "--seed", "0",
        "--dataloader_num_workers", "0", "--disable_tqdm", "true", "--dtype", "float32", *flags,
    ]  # fmt: skip
    parsed = parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], argv)
    record = {}
    trainer, _ = sft.build_trainer(*parsed, callbacks=[_Grads(record)])
    rows, step = [], trainer.training_step

    def recording_step(model, inputs, num_items_in_batch=None):
        rows.append({k: inputs[k].detach().clone() for k in ("input_ids", "labels")})
        return step(model, inputs, num_items_in_batch)

    trainer.training_step = recording_step
    trainer.train()
    assert len(rows) == 2
    return rows, record["grads"]


def assert_gradient_is(model_dir, rows: list[dict], grads: dict, divisor: float) -> None:
    """`grads` equal the gradient of (the summed token CE of `rows`) / `divisor`, by hand."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = 0
    for row in rows:
        logits = model(input_ids=row["input_ids"]).logits[..., :-1, :]
        total = total + F.cross_entropy(logits.flatten(0, 1), row["labels"][..., 1:].flatten(), reduction="sum")
    (total / divisor).backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.usefixtures("one_thread")
def test_summed_loss_gives_open_instructs_gradient(tiny_model_dir, tmp_path):
    """The gradient is the summed token CE of both rows / 2 (open-instruct: `CrossEntropyLoss(reduction="sum")`,
    accelerate divides by the accumulation steps)."""
    flags = ("--loss_reduction", "sum", "--average_tokens_across_devices", "false")
    rows, grads = one_sft_update(tiny_model_dir, tmp_path, *flags)
    assert_gradient_is(tiny_model_dir, rows, grads, divisor=2)


def test_summed_loss_refuses_a_global_token_count_at_parse_time(tiny_model_dir, tmp_path):
    argv = ["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(tmp_path), "--sources", "x.jsonl",
            "--loss_reduction", "sum", "--average_tokens_across_devices", "true", "--use_cpu", "true",
            "--bf16", "false"]  # fmt: skip
    with pytest.raises(RecipeError, match="sum needs average_tokens_across_devices: false"):
        parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], argv)
    argv[7] = "input_tokens"  # the authors' Instella-Long count is per device too
    with pytest.raises(RecipeError, match="input_tokens needs average_tokens_across_devices: false"):
        parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], argv)
    with pytest.raises(RecipeError, match="loss_reduction must be one of"):
        parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig], [*argv[:6], "--loss_reduction", "max"])


def test_sft_stage2_recipe_is_the_authors_config():
    t, _ = parse_recipe(
        [sft.CheckedSFTConfig, CheckedModelConfig],
        ["--config", str(RECIPES / "instella-3b-math" / "sft_stage2.yaml"), "--bf16", "false"],
    )
    args = t
    assert [s["config_name"] for s in args.sources] == ["am_0.5M", "am_0.9M"]
    assert {s["converter"] for s in args.sources} == {"am_deepseek_r1_distilled"}
    assert (args.row_format, args.loss_reduction, t.average_tokens_across_devices) == ("open_instruct", "sum", False)
    assert (t.max_length, t.packing, t.pad_to_multiple_of, t.num_train_epochs) == (32768, False, None, 3)
    assert args.global_batch_size == 128 == t.per_device_train_batch_size * t.gradient_accumulation_steps * 32
    assert (t.learning_rate, str(t.lr_scheduler_type.value), t.warmup_steps, t.weight_decay) == (
        5e-5, "linear", 0.1, 1e-4,
    )  # fmt: skip
    assert (t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.seed) == (0.9, 0.999, 1e-8, 42)
    assert not t.lr_scheduler_kwargs  # transformers' linear schedule (open-instruct's get_scheduler), from 0
    assert t.activation_checkpointing


def test_instella_template_renders_as_tulu_with_bos():
    tok = install_chat_template(load_tokenizer(OLMO_TOKENIZER))
    env_template = "{{ bos_token }}" + authors.TULU_TEMPLATE
    oracle = authors.ChatTokenizer(copy.deepcopy(tok), env_template)
    for row in CONVERSATIONS:
        messages = [{"role": m["role"], "content": m["content"]} for m in row["messages"]]
        ours = tok.apply_chat_template(messages, tokenize=False)
        ids = oracle.apply_chat_template(messages, True, "pt", False, False, None, False)[0]
        assert ours == oracle.tokenizer.decode(ids)
