"""SFT and DPO tokenization: conversations -> the token rows TRL's trainers take, with the bad-input policy of
`checks.py` applied on the way (each skipped or truncated row counted in a `DataReport`).

- `prepare_sft_dataset`: `messages` -> `{input_ids, labels}`, the Instella chat template with assistant-only labels
  (`template.py`), each message's content stripped as the authors' SFT preprocessing does (`row_format: instella`,
  their OLMo-side `prepare_sft_data.py`); or, with `row_format: open_instruct` (Instella-Math SFT stage 2, trained
  with open-instruct's `finetune.py`), contents as they are, the whole conversation rendered and tokenized at once,
  every assistant turn labelled, as its `encode_sft_example` does (the same masks as DPO's, `preference.py`).
- `prepare_dpo_dataset`: preference pairs -> `{chosen_ids, chosen_mask, rejected_ids, rejected_mask}`, each whole
  conversation tokenized and every assistant turn scored as open-instruct's `dpo_tune.py` does (`preference.py`).
"""

from collections import Counter

from datasets import Dataset

from instella_recipes.core import RecipeError

from .checks import KEPT, NO_SIGNAL, OK, TRUNCATED, DataReport, check_overlong_policy, message_problem, pair_problem
from .preference import score_conversations
from .template import IGNORE_INDEX, tokenize_conversations

ROW_FORMATS = ("instella", "open_instruct")


def check_truncation_mode(mode: str) -> None:
    """Rows are cut here, before TRL sees them, keeping the start (the authors' cut; `overlong` says whether a long
    row is cut or dropped), so TRL's `truncation_mode` has nothing left to do: any other value would be ignored."""
    if mode != "keep_start":
        raise RecipeError(
            f"truncation_mode '{mode}' would be ignored: rows are cut keeping their start before TRL sees them (the "
            "authors' cut); remove it, and use `overlong` to choose between cutting and dropping long rows"
        )


def _map_and_count(dataset: Dataset, process, stage: str, num_proc: int | None, desc: str):
    """Run the batched `process` (it returns the new columns and a `_status` per row), count the statuses in a
    `DataReport`, keep the rows that may be trained on."""
    processed = dataset.map(process, batched=True, remove_columns=dataset.column_names, num_proc=num_proc, desc=desc)
    report = DataReport(stage, len(processed), Counter(processed["_status"]))
    kept = processed.filter(lambda s: s in KEPT, input_columns="_status", num_proc=num_proc)
    return kept.remove_columns("_status"), report


def _all_assistant_empty(messages: list[dict]) -> bool:
    """Every assistant message of a conversation is empty (after the authors' strip): only its end is trained."""
    return all(not message["content"].strip() for message in messages if message["role"] == "assistant")


def check_row_format(row_format: str) -> None:
    if row_format not in ROW_FORMATS:
        raise RecipeError(f"row_format must be one of {ROW_FORMATS}, not '{row_format}'")


def _open_instruct_rows(tokenizer, conversations: list[list[dict]], max_length: int | None) -> list[dict]:
    """open-instruct `encode_sft_example` rows: `{input_ids, labels, length}` (length before the cut)."""
    rows = []
    for row in score_conversations(tokenizer, conversations, max_length):
        labels = [t if m else IGNORE_INDEX for t, m in zip(row["ids"], row["mask"], strict=True)]
        rows.append({"input_ids": row["ids"], "labels": labels, "length": row["length"]})
    return rows


def prepare_sft_dataset(
    dataset: Dataset,
    tokenizer,
    max_length: int | None,
    overlong: str = "truncate",
    num_proc: int | None = None,
    row_format: str = "instella",
) -> tuple[Dataset, DataReport]:
    """Validate, strip every message's content (the authors' `.strip()`; not with `open_instruct`), tokenize
    (assistant-only labels, `row_format`, see the module docstring) and apply the overlong policy; return
    `{input_ids, labels}` rows."""
    check_overlong_policy(overlong)
    check_row_format(row_format)
    if "messages" not in dataset.column_names:
        raise RecipeError(f"the SFT dataset has no `messages` column (columns: {dataset.column_names})")
    if row_format == "open_instruct":
        return _prepare_open_instruct(dataset, tokenizer, max_length, overlong, num_proc)

    def process(batch):
        problems = [message_problem(m) for m in batch["messages"]]
        # every message's content stripped before rendering, as the authors' prepare_sft_data.py does
        good = [
            [{**m, "content": m["content"].strip()} for m in messages]
            for messages, p in zip(batch["messages"], problems, strict=True)
            if p is None
        ]
        encoded = iter(tokenize_conversations(tokenizer, good))
        out = {"input_ids": [], "labels": [], "_status": []}
        for messages, problem in zip(batch["messages"], problems, strict=True):
            ids, labels, status = [], [], problem
            if problem is None:
                row = next(encoded)
                ids, labels, status = row["input_ids"], row["labels"], OK
                if max_length is not None and len(ids) > max_length:
                    if overlong == "drop":
                        ids, labels, status = [], [], "longer than max_length (dropped)"
                    else:
                        ids, labels, status = ids[:max_length], labels[:max_length], TRUNCATED
                        if all(label == IGNORE_INDEX for label in labels):
                            ids, labels, status = [], [], "no assistant token within max_length"
                if status in (OK, TRUNCATED) and _all_assistant_empty(messages):
                    status = NO_SIGNAL
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            out["_status"].append(status)
        return out

    return _map_and_count(dataset, process, "sft", num_proc, "tokenize SFT")


def _prepare_open_instruct(dataset, tokenizer, max_length, overlong, num_proc):
    """open-instruct rows: contents unchanged, cut at `max_length` (`overlong: drop` drops instead); rows without a
    label left are dropped (`finetune.py`'s `(labels != -100).any()` filter)."""

    def process(batch):
        problems = [message_problem(m) for m in batch["messages"]]
        good = [messages for messages, p in zip(batch["messages"], problems, strict=True) if p is None]
        encoded = iter(_open_instruct_rows(tokenizer, good, max_length))
        out = {"input_ids": [], "labels": [], "_status": []}
        for messages, problem in zip(batch["messages"], problems, strict=True):
            ids, labels, status = [], [], problem
            if problem is None:
                row = next(encoded)
                ids, labels, status = row["input_ids"], row["labels"], OK
                if row["length"] > len(ids):
                    status = TRUNCATED if overlong == "truncate" else "longer than max_length (dropped)"
                if status == "longer than max_length (dropped)":
                    ids, labels = [], []
                elif all(label == IGNORE_INDEX for label in labels):
                    ids, labels, status = [], [], "no assistant token within max_length"
                elif _all_assistant_empty(messages):
                    status = NO_SIGNAL
            out["input_ids"].append(ids)
            out["labels"].append(labels)
            out["_status"].append(status)
        return out

    return _map_and_count(dataset, process, "sft", num_proc, "tokenize SFT (open-instruct rows)")


def prepare_dpo_dataset(
    dataset: Dataset, tokenizer, max_length: int | None, overlong: str = "truncate", num_proc: int | None = None
) -> tuple[Dataset, DataReport]:
    """Validate preference pairs (whole `chosen` / `rejected` conversations, or TRL's conversational `prompt` +
    completions, joined) and tokenize each conversation as open-instruct's `dpo_tune.py` does, every assistant turn
    scored (`preference.py`); apply the overlong policy by token length. Returns `{chosen_ids, chosen_mask,
    rejected_ids, rejected_mask}` rows for `DataCollatorForScoredPreference`."""
    check_overlong_policy(overlong)
    missing = {"chosen", "rejected"} - set(dataset.column_names)
    if missing:
        raise RecipeError(
            f"the preference dataset has no {sorted(missing)} column(s) (columns: {dataset.column_names}); "
            f"DPO needs `chosen` and `rejected` (and optionally a conversational `prompt`)"
        )

    def process(batch):
        prompts = batch.get("prompt") or [None] * len(batch["chosen"])
        pairs = []
        for prompt, chosen, rejected in zip(prompts, batch["chosen"], batch["rejected"], strict=True):
            if prompt is not None and not isinstance(prompt, list):
                pairs.append((None, None, "not conversational (prompt/chosen/rejected must be message lists)"))
                continue
            if prompt and isinstance(chosen, list) and isinstance(rejected, list):
                chosen, rejected = prompt + chosen, prompt + rejected
            pairs.append((chosen, rejected, pair_problem(chosen, rejected)))
        good = [conversation for c, r, problem in pairs if problem is None for conversation in (c, r)]
        scored = iter(score_conversations(tokenizer, good, max_length))
        out = {"chosen_ids": [], "chosen_mask": [], "rejected_ids": [], "rejected_mask": [], "_status": []}
        for _, _, problem in pairs:
            rows, status = [{"ids": [], "mask": []}] * 2, problem
            if problem is None:
                rows, status = [next(scored), next(scored)], OK
                if any(row["length"] > len(row["ids"]) for row in rows):
                    status = TRUNCATED if overlong == "truncate" else "longer than max_length (dropped)"
                if status != "longer than max_length (dropped)" and not all(any(row["mask"]) for row in rows):
                    status = "no scored token within max_length"
                elif status in (OK, TRUNCATED) and rows[0]["ids"] == rows[1]["ids"]:
                    status = NO_SIGNAL  # chosen == rejected: the DPO loss has no gradient
            for name, row in zip(("chosen", "rejected"), rows, strict=True):
                out[f"{name}_ids"].append(row["ids"])
                out[f"{name}_mask"].append(row["mask"])
            out["_status"].append(status)
        return out

    return _map_and_count(dataset, process, "dpo", num_proc, "tokenize DPO pairs")
