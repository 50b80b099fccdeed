"""SFT / DPO exact to the authors' code (SPEC.md 2.1): the MMLU re-templating of `scripts/prepare_sft_data.py`
(11 templates, data seed 96, options shuffled then a template drawn), the o1-journey target cut, the
OpenMathInstruct-2 fields, stripped message contents, and the published SFT / DPO settings in the recipes.

The reference MMLU conversion below is the authors' `convert_mmlu`, transcribed (module-level `random`, seeded once).
"""

import copy
import random
from pathlib import Path

import pytest
from datasets import Dataset
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.post_training import converters
from instella_recipes.post_training.mixture import build_mixture
from instella_recipes.post_training.template import install_chat_template, tokenize_conversation
from instella_recipes.post_training.tokenization import prepare_sft_dataset

RECIPES = Path(__file__).resolve().parents[3] / "recipes"

# verbatim from AMD-AIG-AIMA/Instella scripts/prepare_sft_data.py (commit f00a236)
AUTHORS_QA_TEMPLATES = [
    {
        "question": "Given the following question and four candidate answers (A, B, C, and D), select the most appropriate answer.\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The most appropriate answer is {answer}.",
    },
    {
        "question": "Choose the correct answer from the options below (A, B, C, or D):\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The correct answer is {answer}.",
    },
    {
        "question": "Based on the following question and options, identify the best answer (A, B, C, or D).\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The best answer is {answer}.",
    },
    {
        "question": "Analyze the question and the four answer choices (A, B, C, and D). Then select the correct answer.\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "After analysis, the correct answer is {answer}.",
    },
    {
        "question": "Consider the question below and choose the best option from A, B, C, or D.\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The best option is {answer}.",
    },
    {
        "question": "Select the correct response (A, B, C, or D) to the question provided below.\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The correct response is {answer}.",
    },
    {
        "question": "Determine the correct choice (A, B, C, or D) based on the question and information provided.\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The determined correct choice is {answer}.",
    },
    {
        "question": "From the following question and answer choices, identify the correct option (A, B, C, or D).\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The identified correct option is {answer}.",
    },
    {
        "question": "Using the given question and four possible answers, select the best option (A, B, C, or D).\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The selected best option is {answer}.",
    },
    {
        "question": "Read the question and options below, then determine the correct answer (A, B, C, or D).\nQuestion: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",  # noqa: E501
        "answer": "The determined correct answer is {answer}.",
    },
    {
        "question": "Question: {question}\nA. {option_a}\nB. {option_b}\nC. {option_c}\nD. {option_d}",
        "answer": "{answer}.",
    },
]


def authors_convert_mmlu(samples: list[dict], seed: int = 96) -> list[list[dict]]:
    """`convert_mmlu` + `random.seed(opts.seed)` of prepare_sft_data.py, transcribed."""
    state = random.getstate()
    random.seed(seed)
    out = []
    for sample in samples:
        question, options, correct_answer = (sample["train"][k] for k in ("question", "choices", "answer"))
        options = list(options)
        labels = ["A", "B", "C", "D"]
        correct_option = options[correct_answer]
        random.shuffle(options)
        shuffled_options = {label: option for label, option in zip(labels, options)}
        new_answer_label = next(label for label, option in shuffled_options.items() if option == correct_option)
        qa_template = random.choice(AUTHORS_QA_TEMPLATES)
        formatted_question = qa_template["question"].format(
            question=question, option_a=shuffled_options["A"], option_b=shuffled_options["B"],
            option_c=shuffled_options["C"], option_d=shuffled_options["D"],
        )  # fmt: skip
        out.append([
            {"role": "user", "content": formatted_question},
            {"role": "assistant", "content": qa_template["answer"].format(answer=new_answer_label)},
        ])  # fmt: skip
    random.setstate(state)
    return out


def _mmlu_rows(n: int) -> list[dict]:
    rng = random.Random(7)
    return [
        {"train": {"question": f"Q{i}? ", "choices": [f"o{i}-{j}" for j in range(4)], "answer": rng.randrange(4),
                   "subject": ""}}
        for i in range(n)
    ]  # fmt: skip


def test_mmlu_templates_are_the_authors_eleven():
    assert len(converters.MMLU_QA_TEMPLATES) == 11
    ours = [{"question": q, "answer": a} for q, a in converters.MMLU_QA_TEMPLATES]
    assert ours == AUTHORS_QA_TEMPLATES


def test_mmlu_conversion_replays_the_authors_data_seed_row_by_row(tmp_path):
    rows = _mmlu_rows(300)
    expected = authors_convert_mmlu(rows)
    assert [r["messages"] for r in converters.mmlu_auxiliary_train(rows, seed=96)] == expected
    # the same through the mixture (recipe path: conversion_seed 96, sequential in row order, then shuffled)
    path = tmp_path / "mmlu.jsonl"
    Dataset.from_list(rows).to_json(path)
    mixed, _ = build_mixture([{"path": str(path), "converter": "mmlu_auxiliary_train"}], seed=6198, num_proc=2)
    assert sorted(map(str, mixed["messages"])) == sorted(map(str, expected))
    used = {m[1]["content"][:-2] for m in expected}  # the answer without its "X."
    assert len(used) == 11  # every template drawn over 300 rows; the bare last one answers "{letter}."
    assert any(m[0]["content"].startswith("Question: Q") and len(m[1]["content"]) == 2 for m in expected)


def test_o1_journey_target_is_cut_at_the_first_answer_marker():
    row = {"question": "q", "longCOT": "think\nmore\n#### 42\nextra\n#### 43"}
    assert converters.o1_journey(row, 0)["messages"][1]["content"] == "think\nmore"


def test_openmathinstruct2_uses_problem_and_generated_solution():
    row = {"problem": "p", "generated_solution": "s", "expected_answer": "x", "problem_source": "y"}
    assert converters.openmathinstruct2(row, 0)["messages"] == [
        {"role": "user", "content": "p"},
        {"role": "assistant", "content": "s"},
    ]


def test_sft_message_contents_are_stripped_before_rendering(tiny_tokenizer):
    tok = install_chat_template(copy.deepcopy(tiny_tokenizer))
    padded = [{"role": "user", "content": "  What is 2 + 3?\n"}, {"role": "assistant", "content": "\n 5. \n\n"}]
    stripped = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5."}]
    kept, _ = prepare_sft_dataset(Dataset.from_list([{"messages": padded}]), tok, max_length=128)
    assert kept[0] == tokenize_conversation(tok, stripped)


def authors_sft_row(encode, messages: list[dict], max_seq_len: int, eos: int = 0, pad: int = 1):
    """The authors' SFT row rules (`scripts/prepare_sft_data.py:229-262` `preprocess`), restated: the row starts
    with the EOS id unlabelled; per message `<|role|>\\n` encoded alone (unlabelled), then the stripped content +
    `\\n` encoded alone (unlabelled), for the assistant content + EOS + `\\n` (labelled but its last token, the
    `\\n`); cut to `max_seq_len`, right-padded with the pad id (unlabelled); `:225-226` rows with no label are
    dropped (None). Labels as `instella/train.py:599-613` `get_labels` sees them: ids where labelled, else -100."""
    ids, mask = [eos], [False]
    for message in messages:
        header = encode(f"<|{message['role']}|>\n")
        ids, mask = ids + header, mask + [False] * len(header)
        if message["role"] == "assistant":
            body = encode(message["content"].strip() + "<|endoftext|>" + "\n")
            assert body[-2] == eos
            ids, mask = ids + body, mask + [True] * (len(body) - 1) + [False]
        else:
            body = encode(message["content"].strip() + "\n")
            ids, mask = ids + body, mask + [False] * len(body)
    ids, mask = ids[:max_seq_len], mask[:max_seq_len]
    ids, mask = ids + [pad] * (max_seq_len - len(ids)), mask + [False] * (max_seq_len - len(mask))
    if not any(mask):
        return None
    return ids, [t if m else -100 for t, m in zip(ids, mask, strict=True)]


SFT_CASES = [
    [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "2 + 3 = 5. The answer is 5."}],
    [{"role": "system", "content": " You are terse. "}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?\nBriefly."},
     {"role": "assistant", "content": " Rome. "}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "   "}, {"role": "assistant", "content": "Ok."}],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": "  "}],  # empty answer: kept
    [{"role": "user", "content": "Café naïve ½ → ∑ 日本語\n\n\n  tabs\tand   spaces"},
     {"role": "assistant", "content": "\n\nCafé.\n\n"}],
    [{"role": "user", "content": "long " * 30}, {"role": "assistant", "content": "cut " * 30}],  # truncated
    [{"role": "user", "content": "long " * 60}, {"role": "assistant", "content": "never seen"}],  # no label left
]  # fmt: skip


@pytest.mark.parametrize("max_length", [4096, 48])
def test_sft_rows_are_the_authors_token_by_token(max_length):
    """Our rows through TRL's SFT collator (padded to `max_length`, as the recipe's `pad_to_multiple_of`) equal the
    authors' rows at every position, ids and labels, on the real OLMo tokenizer (`tokenizers` as the authors call
    it: `encode_batch` of the raw tokenizer file, no special tokens added)."""
    from tokenizers import Tokenizer
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from instella_recipes.data.tokenizer import load_tokenizer
    from tests.conftest import OLMO_TOKENIZER

    raw = Tokenizer.from_file(str(OLMO_TOKENIZER))
    expected = [authors_sft_row(lambda text: raw.encode_batch([text])[0].ids, m, max_length) for m in SFT_CASES]
    expected = [row for row in expected if row is not None]
    tok = install_chat_template(load_tokenizer(OLMO_TOKENIZER))
    kept, report = prepare_sft_dataset(Dataset.from_list([{"messages": m} for m in SFT_CASES]), tok, max_length)
    assert report.kept == len(expected) == len(SFT_CASES) - (max_length < 100)
    batch = DataCollatorForLanguageModeling(pad_token_id=tok.pad_token_id, pad_to_multiple_of=max_length)(
        [dict(row) for row in kept]
    )
    assert batch["input_ids"].shape == (len(expected), max_length)
    assert batch["input_ids"].tolist() == [ids for ids, _ in expected]
    assert batch["labels"].tolist() == [labels for _, labels in expected]


def _sft(path):
    from instella_recipes.post_training.sft import CheckedSFTConfig

    return parse_recipe([CheckedSFTConfig, ModelConfig], ["--config", str(path), "--bf16", "false"])


@pytest.mark.parametrize("name", ["sft.yaml", "sft-packed.yaml", "sft-lora.yaml"])
def test_instella_sft_recipes_use_the_authors_seeds_and_loss_normalisation(name):
    t, _ = _sft(RECIPES / "instella-3b" / name)
    args = t
    assert t.seed == 6198 and args.conversion_seed == 96
    assert t.average_tokens_across_devices is False  # normalize_by_label_mask: per device, then mean over devices
    assert t.dataloader_drop_last  # configs/instella-3b-sft.yaml:100 data.drop_last: true
    assert args.fsdp_reduce_dtype == "float32"  # :86 fsdp.precision: mixed


def test_instella_dpo_recipes_use_open_instructs_adamw_and_seed():
    from instella_recipes.post_training.dpo import CheckedDPOConfig

    for name in ("dpo.yaml", "dpo-lora.yaml"):
        t, _ = parse_recipe(
            [CheckedDPOConfig, ModelConfig],
            ["--config", str(RECIPES / "instella-3b" / name), "--bf16", "false"],
        )
        assert (t.adam_beta1, t.adam_beta2, t.adam_epsilon, t.weight_decay, t.seed) == (0.9, 0.999, 1e-8, 0.0, 42)
