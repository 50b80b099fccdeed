"""The Instella chat template and its SFT label mask, with the real OLMo tokenizer (SPEC.md section 1)."""

import copy

import pytest

from instella_recipes.post_training.template import IGNORE_INDEX, install_chat_template, tokenize_conversation

EOS = "<|endoftext|>"
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "What is the capital of France?"}
ASSISTANT1 = {"role": "assistant", "content": "The capital of France is Paris."}
USER2 = {"role": "user", "content": "And of Italy?\nAnswer briefly."}
ASSISTANT2 = {"role": "assistant", "content": " Rome."}  # leading space: the case transformers' own mask misses


@pytest.fixture(scope="module")
def tok(olmo_tokenizer):
    return install_chat_template(copy.deepcopy(olmo_tokenizer))  # the session fixture stays untouched


# The SPEC.md layout, written out by hand: (text, trained) segments.
CASES = {
    "single_turn": (
        [USER1, ASSISTANT1],
        [(EOS, 0), ("<|user|>\n" + USER1["content"] + "\n", 0), ("<|assistant|>\n", 0),
         (ASSISTANT1["content"] + EOS, 1)],
    ),
    "multi_turn": (
        [USER1, ASSISTANT1, USER2, ASSISTANT2],
        [(EOS, 0), ("<|user|>\n" + USER1["content"] + "\n", 0), ("<|assistant|>\n", 0),
         (ASSISTANT1["content"] + EOS, 1), ("\n", 0), ("<|user|>\n" + USER2["content"] + "\n", 0),
         ("<|assistant|>\n", 0), (ASSISTANT2["content"] + EOS, 1)],
    ),
    "system": (
        [SYSTEM, USER1, ASSISTANT1],
        [(EOS, 0), ("<|system|>\n" + SYSTEM["content"] + "\n", 0), ("<|user|>\n" + USER1["content"] + "\n", 0),
         ("<|assistant|>\n", 0), (ASSISTANT1["content"] + EOS, 1)],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(CASES))
def test_rendering_matches_spec_layout(tok, case):
    messages, segments = CASES[case]
    assert tok.apply_chat_template(messages, tokenize=False) == "".join(text for text, _ in segments)


def test_generation_prompt(tok):
    expected = EOS + "<|system|>\n" + SYSTEM["content"] + "\n<|user|>\n" + USER1["content"] + "\n<|assistant|>\n"
    assert tok.apply_chat_template([SYSTEM, USER1], tokenize=False, add_generation_prompt=True) == expected
    # a conversation ending with an assistant turn has no newline after its EOS; with the prompt a new turn opens
    text = tok.apply_chat_template([USER1, ASSISTANT1, USER2], tokenize=False, add_generation_prompt=True)
    assert text.endswith(ASSISTANT1["content"] + EOS + "\n<|user|>\n" + USER2["content"] + "\n<|assistant|>\n")


def test_bos_is_id_0_and_roles_are_plain_text(tok):
    ids = tok.apply_chat_template([USER1, ASSISTANT1], tokenize=True, return_dict=True)["input_ids"]
    assert ids[0] == 0 and ids[-1] == 0 and ids.count(0) == 2  # BOS and the one EOS
    assert "<|user|>" not in tok.get_vocab() and "<|assistant|>" not in tok.get_vocab()


@pytest.mark.parametrize("case", sorted(CASES))
def test_label_mask_token_by_token(tok, case):
    """Each segment tokenized on its own gives the expected tokens and flags; the SFT row is the rendering plus the
    authors' unlabelled "\\n" after the final EOS (prepare_sft_data.py), labels = id where trained (assistant content
    + EOS), -100 elsewhere."""
    messages, segments = CASES[case]
    segments = [*segments, ("\n", 0)]
    expected_ids, expected_labels = [], []
    for text, trained in segments:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        expected_ids += ids
        expected_labels += ids if trained else [IGNORE_INDEX] * len(ids)
    row = tokenize_conversation(tok, messages)
    assert row["input_ids"] == expected_ids
    assert row["labels"] == expected_labels
    # readable restatement of the rule: trained tokens decode to exactly the assistant contents + EOS
    trained = tok.decode([t for t in row["labels"] if t != IGNORE_INDEX])
    assert trained == "".join(m["content"] + EOS for m in messages if m["role"] == "assistant")
    # the newline after a non-final EOS is never trained
    for i, token in enumerate(row["input_ids"][:-1]):
        if token == 0 and i > 0:
            assert row["labels"][i] == 0 and row["labels"][i + 1] in (IGNORE_INDEX,)


def test_another_template_trains_its_generation_spans(tok):
    """With a template other than Instella's (`chat_template_path`) a row is that template's rendering, and the tokens
    inside its `{% generation %}` spans are trained (no authors' trailing newline)."""
    other = copy.deepcopy(tok)
    other.chat_template = "{# another template #}" + tok.chat_template
    messages, segments = CASES["multi_turn"]
    row = tokenize_conversation(other, messages)
    assert (
        row["input_ids"]
        == tok(tok.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    )
    trained = other.decode([t for t in row["labels"] if t != IGNORE_INDEX])
    assert trained == "".join(text for text, flag in segments if flag) and row["labels"][-1] == 0


def test_unknown_role_is_an_error(tok):
    with pytest.raises(Exception, match="unknown role"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_saved_tokenizer_keeps_template(tok, tmp_path):
    from instella_recipes.data.tokenizer import load_tokenizer

    tok.save_pretrained(tmp_path)
    again = load_tokenizer(tmp_path)
    assert again.apply_chat_template([USER1, ASSISTANT1], tokenize=False) == tok.apply_chat_template(
        [USER1, ASSISTANT1], tokenize=False
    )
