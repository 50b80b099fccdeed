"""DPO exact to the authors' `scripts/dpo_tune.py` (open-instruct at 4365dea3d, which it copies): which tokens of a
pair are scored, which pairs are kept, and the `dpo_norm` loss, on the real OLMo tokenizer.

The reference below restates open-instruct's rules from their files (facts, not their code):
- `dpo_tune.py:399-423` `encode_dpo_example`: chosen and rejected are each encoded alone by `encode_sft_example`;
  `:121-122` the default chat template is `tulu` and `:709-717` `add_bos` prefixes `{{ bos_token }}` (= Instella's
  template); `:779-780` pairs whose chosen or rejected has no label left are dropped, nothing else is.
- `finetune.py:385-450` `encode_sft_example`: `apply_chat_template(messages, tokenize=True, truncation=True,
  max_length)` of the whole conversation, labels = input ids; for each non-assistant message i, labels in
  [start, end) = -100 with start = 0 for i = 0, else the token count of `apply_chat_template(messages[:i])`, and end =
  the token count of `apply_chat_template(messages[:i + 1], add_generation_prompt=<next is assistant>)` (both cut to
  max_length); stop after a message whose end reaches max_length.
- `dpo_utils.py:139-168` `_get_batch_logps`: labels shifted by one (`labels[:, 1:]`), the average over labelled
  positions when `average_log_prob` (`dpo_tune.py:942-943`: `dpo_norm`); `dpo_utils.py:70` the sigmoid loss on
  beta x (policy log-ratio - reference log-ratio); `dpo_tune.py:992` its mean over the batch.
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from datasets import Dataset
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.post_training import dpo
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.post_training.tokenization import prepare_dpo_dataset
from tests.conftest import ROOT, tiny_config

IGNORE = -100
U1 = {"role": "user", "content": "Hi!"}
A1 = {"role": "assistant", "content": "Hello! How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
SYSTEM = {"role": "system", "content": "Answer briefly."}


def said(content: str) -> list[dict]:
    return [{"role": "assistant", "content": content}]


@pytest.fixture(scope="module")
def tok(olmo_tokenizer):
    return install_chat_template(copy.deepcopy(olmo_tokenizer))


def authors_encode(tok, messages: list[dict], max_length: int) -> tuple[list[int], list[int]]:
    """open-instruct's `encode_sft_example` rule (module docstring), with the tokenizer's own chat template calls."""

    def n_tokens(conversation, generation_prompt=False):
        ids = tok.apply_chat_template(
            conversation, tokenize=True, truncation=True, max_length=max_length,
            add_generation_prompt=generation_prompt, return_dict=True,
        )["input_ids"]  # fmt: skip
        return ids

    ids = n_tokens(messages)
    labels = list(ids)
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            continue
        start = 0 if i == 0 else len(n_tokens(messages[:i]))
        next_is_assistant = i < len(messages) - 1 and messages[i + 1]["role"] == "assistant"
        end = len(n_tokens(messages[: i + 1], next_is_assistant))
        labels[start:end] = [IGNORE] * len(labels[start:end])
        if end >= max_length:
            break
    return ids, labels


def scored(labels: list[int]) -> list[int]:
    """Positions `_get_batch_logps` averages over: labelled ones after the first (labels[:, 1:])."""
    return [1 if i > 0 and label != IGNORE else 0 for i, label in enumerate(labels)]


PAIRS = {
    # earlier assistant turn scored too; the last turn starts with "\n\n", which merges with the header's newline
    "multi_turn": {"chosen": [U1, A1, U2, *said("\n\n4")], "rejected": [U1, A1, U2, *said("5")]},
    "system_and_leading_space": {"chosen": [SYSTEM, U2, *said(" 4")], "rejected": [SYSTEM, U2, *said("  five")]},
    "chosen_equals_rejected": {"chosen": [U2, *said("4")], "rejected": [U2, *said("4")]},
    "empty_answer": {"chosen": [U2, *said("")], "rejected": [U2, *said("5")]},
    "prompt_column": {"prompt": [U1, A1, U2], "chosen": said("4"), "rejected": said("22")},
    "assistant_first": {"chosen": [A1, U2, *said("4")], "rejected": [A1, U2, *said("3")]},
}


def _rows(pairs: dict) -> Dataset:
    rows = [{"prompt": p.get("prompt", []), "chosen": p["chosen"], "rejected": p["rejected"]} for p in pairs.values()]
    return Dataset.from_list(rows)


@pytest.mark.parametrize("max_length", [None, 24, 16, 12])
def test_scored_tokens_follow_dpo_tune(tok, max_length):
    kept, report = prepare_dpo_dataset(_rows(PAIRS), tok, max_length=max_length)
    limit = max_length or 10**6
    expected = []
    for pair in PAIRS.values():
        prompt = pair.get("prompt", [])
        encoded = [authors_encode(tok, prompt + pair[side], limit) for side in ("chosen", "rejected")]
        if all(any(scored(labels)) for _, labels in encoded):  # dpo_tune.py:779-780
            expected.append(encoded)
    assert report.kept == len(expected) == len(kept)
    for row, ((c_ids, c_labels), (r_ids, r_labels)) in zip(kept, expected, strict=True):
        assert row["chosen_ids"] == c_ids and row["chosen_mask"] == scored(c_labels)
        assert row["rejected_ids"] == r_ids and row["rejected_mask"] == scored(r_labels)


def test_every_assistant_turn_is_scored_with_the_authors_boundary(tok):
    """The multi-turn pair by hand: both assistant turns are scored (TRL alone would score the last); the last turn's
    "\\n\\n4" tokenizes as `\\n\\n`+`\\n`+`4` after the header, and the authors cut at the header's own token count,
    so 3 tokens of that turn are scored (TRL's common-prefix cut: 4)."""
    kept, _ = prepare_dpo_dataset(_rows({"p": PAIRS["multi_turn"]}), tok, max_length=None)
    ids, mask = kept[0]["chosen_ids"], kept[0]["chosen_mask"]
    runs, current = [], []
    for token, flag in zip(ids, mask, strict=True):
        if flag:
            current.append(token)
        elif current:
            runs, current = [*runs, current], []
    runs.append(current)
    assert [tok.decode(run) for run in runs] == ["Hello! How can I help?<|endoftext|>", "\n4<|endoftext|>"]
    assert len(runs[1]) == 3 and sum(mask) == 11
    header = tok.apply_chat_template([U1, A1, U2], add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids[len(header) - 1] == tok.convert_tokens_to_ids("ĊĊ")  # the header's "\n" merged with the answer's
    assert mask[len(header) - 1] == 0


def test_pairs_the_authors_keep_are_kept(tok):
    _, report = prepare_dpo_dataset(_rows(PAIRS), tok, max_length=None)
    assert report.kept == len(PAIRS) and report.skipped == {}  # chosen == rejected and empty answers included
    _, report = prepare_dpo_dataset(_rows(PAIRS), tok, max_length=8)
    assert report.skipped == {"no scored token within max_length": len(PAIRS) - 1}  # assistant_first keeps A1


@pytest.fixture(scope="module")
def olmo_model_dir(tmp_path_factory, tok):
    """A tiny random Instella over the real OLMo vocabulary, saved with the tokenizer."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_olmo_vocab")
    from modeling_instella import InstellaForCausalLM

    config = tiny_config(vocab_size=50304, hidden_size=32, intermediate_size=64, num_attention_heads=2)
    InstellaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def _avg_logps(model, ids: list[int], labels: list[int]) -> torch.Tensor:
    """`_get_batch_logps(..., average_log_prob=True)` for one unpadded conversation, from the plain logits."""
    logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    targets = torch.tensor(ids[1:])
    mask = torch.tensor([label != IGNORE for label in labels[1:]], dtype=torch.float32)
    per_token = torch.log_softmax(logits, -1).gather(-1, targets[:, None])[:, 0]
    return (per_token * mask).sum() / mask.sum()


def test_dpo_norm_loss_on_multi_turn_pairs_equals_the_hand_computation(olmo_model_dir, tok, tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _rows(PAIRS).to_list()))
    argv = [
        "--config", str(ROOT / "recipes" / "tiny" / "dpo.yaml"), "--model_name_or_path", str(olmo_model_dir),
        "--output_dir", str(tmp_path / "out"), "--sources", f"{{path: {data}, converter: preference}}",
        "--max_length", "64", "--per_device_train_batch_size", str(len(PAIRS)), "--global_batch_size",
        str(len(PAIRS)), "--report_to", "none",
    ]  # fmt: skip
    training_args, model_args = parse_recipe([dpo.CheckedDPOConfig, ModelConfig], argv)
    trainer, _ = dpo.build_trainer(training_args, model_args)
    assert trainer.loss_types == ["sigmoid_norm"] and trainer.beta == 5.0
    torch.manual_seed(1)
    with torch.no_grad():  # the policy moves away from the reference, so the loss is not log 2
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    rows = [trainer.train_dataset[i] for i in range(len(trainer.train_dataset))]
    loss = trainer.compute_loss(trainer.model, dict(trainer.data_collator(rows)))

    by_chosen = {json.dumps(r["chosen_ids"]) + json.dumps(r["rejected_ids"]): r for r in rows}
    losses = []
    with torch.no_grad():
        for pair in PAIRS.values():
            prompt = pair.get("prompt", [])
            (c_ids, c_labels), (r_ids, r_labels) = (
                authors_encode(tok, prompt + pair[s], 64) for s in ("chosen", "rejected")
            )
            assert json.dumps(c_ids) + json.dumps(r_ids) in by_chosen  # the trainer holds this pair (order shuffled)
            logratio = [
                _avg_logps(trainer.model, ids, labels) - _avg_logps(trainer.ref_model, ids, labels)
                for ids, labels in ((c_ids, c_labels), (r_ids, r_labels))
            ]
            losses.append(-F.logsigmoid(5.0 * (logratio[0] - logratio[1])))
    expected = torch.stack(losses).mean()
    assert abs(expected.item() - F.softplus(torch.tensor(0.0)).item()) > 1e-3
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-4, atol=1e-5)
