# ruff: noqa: E501  (a docstring copied verbatim)
"""Test-only oracle for Instella-Math SFT stage 2, copied verbatim from github.com/AMD-AIG-AIMA/Instella-Math @
65534d3 (the authors' open-instruct copy and data script). Not library code.

- `TULU_TEMPLATE`: `sft/open_instruct/dataset_processor.py` `CHAT_TEMPLATES["tulu"]` (L133-150), the default
  `chat_template_name` of `finetune.py`; `add_bos: true` prefixes `"{{ bos_token }}"` (finetune.py L697-705).
- `encode_sft_example`: `sft/open_instruct/finetune.py` L385-455.
- `is_english`: `sft/prepare_ammath_dataset.py` L24-33.

`ChatTokenizer` stands in for the transformers 4.4x tokenizer open-instruct ran with: `apply_chat_template(...,
tokenize=True, return_tensors="pt", truncation=True, max_length=n)` = render the template (jinja2, the variables
transformers passes) and encode the text without special tokens, cut to `max_length`, as a `(1, n)` tensor.
"""

import jinja2
import torch
from langdetect import detect
from langdetect.lang_detect_exception import LangDetectException


class ChatTokenizer:
    def __init__(self, tokenizer, chat_template: str):
        self.tokenizer, self.chat_template = tokenizer, chat_template

    def apply_chat_template(self, conversation, tokenize, return_tensors, padding, truncation, max_length,
                            add_generation_prompt):  # fmt: skip
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
        text = env.from_string(self.chat_template).render(
            messages=conversation, add_generation_prompt=add_generation_prompt, **self.tokenizer.special_tokens_map
        )
        ids = self.tokenizer(text, add_special_tokens=False, truncation=truncation, max_length=max_length)["input_ids"]
        return torch.tensor([ids])


# ---- verbatim (only re-laid-out by ruff format) ----

TULU_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{{ '<|system|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'user' %}"
    "{{ '<|user|>\n' + message['content'] + '\n' }}"
    "{% elif message['role'] == 'assistant' %}"
    "{% if not loop.last %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token + '\n' }}"
    "{% else %}"
    "{{ '<|assistant|>\n'  + message['content'] + eos_token }}"
    "{% endif %}"
    "{% endif %}"
    "{% if loop.last and add_generation_prompt %}"
    "{{ '<|assistant|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
)


def encode_sft_example(example, tokenizer, max_seq_length):
    """
    This function encodes a single example into a format that can be used for sft training.
    Here, we assume each example has a 'messages' field. Each message in it is a dict with 'role' and 'content' fields.
    We use the `apply_chat_template` function from the tokenizer to tokenize the messages and prepare the input and label tensors.
    """
    messages = example["messages"]
    if len(messages) == 0:
        raise ValueError("messages field is empty.")
    input_ids = tokenizer.apply_chat_template(
        conversation=messages,
        tokenize=True,
        return_tensors="pt",
        padding=False,
        truncation=True,
        max_length=max_seq_length,
        add_generation_prompt=False,
    )
    labels = input_ids.clone()
    # mask the non-assistant part for avoiding loss
    for message_idx, message in enumerate(messages):
        if message["role"] != "assistant":
            # we calculate the start index of this non-assistant message
            if message_idx == 0:
                message_start_idx = 0
            else:
                message_start_idx = tokenizer.apply_chat_template(
                    conversation=messages[:message_idx],  # here marks the end of the previous messages
                    tokenize=True,
                    return_tensors="pt",
                    padding=False,
                    truncation=True,
                    max_length=max_seq_length,
                    add_generation_prompt=False,
                ).shape[1]
            # next, we calculate the end index of this non-assistant message
            if message_idx < len(messages) - 1 and messages[message_idx + 1]["role"] == "assistant":
                # for intermediate messages that follow with an assistant message, we need to
                # set `add_generation_prompt=True` to avoid the assistant generation prefix being included in the loss
                # (e.g., `<|assistant|>`)
                message_end_idx = tokenizer.apply_chat_template(
                    conversation=messages[: message_idx + 1],
                    tokenize=True,
                    return_tensors="pt",
                    padding=False,
                    truncation=True,
                    max_length=max_seq_length,
                    add_generation_prompt=True,
                ).shape[1]
            else:
                # for the last message or the message that doesn't follow with an assistant message,
                # we don't need to add the assistant generation prefix
                message_end_idx = tokenizer.apply_chat_template(
                    conversation=messages[: message_idx + 1],
                    tokenize=True,
                    return_tensors="pt",
                    padding=False,
                    truncation=True,
                    max_length=max_seq_length,
                    add_generation_prompt=False,
                ).shape[1]
            # set the label to -100 for the non-assistant part
            labels[:, message_start_idx:message_end_idx] = -100
            if max_seq_length and message_end_idx >= max_seq_length:
                break
    attention_mask = torch.ones_like(input_ids)
    return {
        "input_ids": input_ids.flatten(),
        "labels": labels.flatten(),
        "attention_mask": attention_mask.flatten(),
    }


# Define a filter function to keep only English messages
def is_english(example):
    messages = example["messages"]
    # Assuming messages is a list of strings or dictionaries with text fields
    # Adjust based on your data structure
    question = messages[0]["content"]
    try:
        return detect(question) == "en"
    except LangDetectException:
        return False
