"""Test-only oracle: the authors' SFT row builder, copied verbatim (functions `convert_openmathinstruct`, `filter`,
`preprocess`) from github.com/AMD-AIG-AIMA/Instella @ f00a236 (`add math sft stage1 scripts`), file
`scripts/prepare_sft_data.py` (lines 136-149 and 224-262), the script `scripts/prepare_math_sft_data.sh` runs for
Instella-Math SFT stage 1 (`--dataset openmathinstruct-2 --eos 0 --pad 1 -s 4096`). Not library code.

`Tokenizer` below stands in for `instella.tokenizer.Tokenizer` with only what `preprocess` uses: `encode(text,
add_special_tokens=False)` = the raw `tokenizers` file's `encode_batch([text])[0].ids` (their `encode_batch`, L157-174,
with nothing appended), `eos_token` = the decoded EOS id (L48-49), and the two ids.
"""

import logging

import datasets as ds
from tokenizers import Tokenizer as BaseTokenizer

log = logging.getLogger(__name__)


class Tokenizer:
    def __init__(self, filename, eos_token_id: int = 0, pad_token_id: int = 1):
        self.base_tokenizer = BaseTokenizer.from_file(str(filename))
        self.eos_token_id, self.pad_token_id = eos_token_id, pad_token_id

    @property
    def eos_token(self) -> str:
        return self.base_tokenizer.decode([self.eos_token_id], skip_special_tokens=False)

    def encode(self, input: str, add_special_tokens: bool = True) -> list[int]:
        ids = self.base_tokenizer.encode_batch([input])[0].ids
        if add_special_tokens and (not ids or ids[-1] != self.eos_token_id):
            ids.append(self.eos_token_id)
        return ids


# ---- verbatim from scripts/prepare_sft_data.py @ f00a236 (only re-laid-out by ruff format) ----


def convert_openmathinstruct(dataset):
    log.info("Converting openmathinstruct ...")
    y_all = []
    for i, sample in enumerate(dataset):
        y = {
            "dataset": "openmathinstruct",
            "id": "openmathinstruct_{}".format(i),  # noqa: UP032
            "messages": [
                {"role": "user", "content": sample["problem"]},
                {"role": "assistant", "content": sample["generated_solution"]},
            ],
        }
        y_all.append(y)

    log.info(f"In total {len(y_all)} samples")

    return ds.Dataset.from_list(y_all)


def filter(example):
    return example["n_labels"] > 0


def preprocess(example, tokenizer: Tokenizer, max_seq_len: int):
    input_ids = [tokenizer.eos_token_id]
    label_mask = [False]

    for msg in example["messages"]:
        role_tokens = tokenizer.encode(f"<|{msg['role']}|>\n", add_special_tokens=False)
        label_mask += [False] * len(role_tokens)
        input_ids += role_tokens

        if msg["role"] == "assistant":
            content_tokens = tokenizer.encode(
                msg["content"].strip() + tokenizer.eos_token + "\n", add_special_tokens=False
            )
            label_mask += [True] * len(content_tokens)
            # mask out the last '\n'
            assert content_tokens[-2] == tokenizer.eos_token_id
            label_mask[-1] = False
        else:
            content_tokens = tokenizer.encode(msg["content"].strip() + "\n", add_special_tokens=False)
            label_mask += [False] * len(content_tokens)
        input_ids += content_tokens

    input_ids = input_ids[:max_seq_len]
    label_mask = label_mask[:max_seq_len]

    if len(input_ids) < max_seq_len:
        pad_len = max_seq_len - len(input_ids)
        input_ids += [tokenizer.pad_token_id] * pad_len
        label_mask += [False] * pad_len

    assert len(input_ids) == len(label_mask)
    n_labels = sum(label_mask)

    return {"input_ids": input_ids, "label_mask": label_mask, "n_labels": n_labels}
