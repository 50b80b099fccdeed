"""The Instella chat template (SPEC.md section 1) and the SFT rows and label masks built with it.

Layout: BOS, then `<|system|>\\n{content}\\n`, `<|user|>\\n{content}\\n`, `<|assistant|>\\n{content}<|endoftext|>` plus
`\\n` unless it is the last message; `add_generation_prompt` appends `<|assistant|>\\n`. The assistant content and its
EOS sit inside `{% generation %}` markers, so the template itself states which characters are trained.

SFT rows with the Instella template are built as the authors' `scripts/prepare_sft_data.py` (`preprocess`) builds
them: BOS, then for every message its role header `<|role|>\\n` and its body (content + `\\n`; assistant: content +
EOS + `\\n`), **each piece tokenized on its own**; labels are the assistant content and its EOS, not the `\\n` after
it. So a row is the template's rendering plus a final unlabelled `\\n` after the last EOS (the authors' rows all end
so), and no token spans two pieces (by construction, where the whole rendered string could merge a boundary).

With another template (`chat_template_path`) a row is that template's rendering, and a token is trained iff its
characters overlap a `{% generation %}` span. Why our own mask builder instead of
`apply_chat_template(return_assistant_tokens_mask=True)` (what TRL's `assistant_only_loss` uses): transformers maps
each generation span to tokens with `char_to_token` on its first character, and the byte-level BPE trims a leading
space out of token offsets, so an assistant message that starts with a space (" 4") gets `None` there and transformers
stops marking that turn *and every later turn* in the conversation, silently.
"""

from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

TEMPLATE_FILE = Path(__file__).with_name("chat_template.jinja")
INSTELLA_CHAT_TEMPLATE = TEMPLATE_FILE.read_text()
ROLES = ("system", "user", "assistant")
IGNORE_INDEX = -100


def install_chat_template(tokenizer, chat_template_path: str | Path | None = None):
    """Put the Instella template (or the file at `chat_template_path`) on `tokenizer`; it is saved with the tokenizer
    (`chat_template.jinja` in the folder), so `apply_chat_template` on the output directory renders it."""
    tokenizer.chat_template = Path(chat_template_path).read_text() if chat_template_path else INSTELLA_CHAT_TEMPLATE
    if tokenizer.pad_token is None:
        raise ValueError("the tokenizer has no pad token: Instella uses <|padding|> (id 1)")
    return tokenizer


def render(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character spans inside `{% generation %}` (assistant content + EOS)."""
    rendered, spans = render_jinja_template(
        conversations=[messages],
        chat_template=tokenizer.chat_template,
        return_assistant_tokens_mask=True,
        add_generation_prompt=add_generation_prompt,
        **tokenizer.special_tokens_map,
    )
    return rendered[0], spans[0]


def _in_spans(start: int, end: int, spans: list[tuple[int, int]]) -> bool:
    if end == start:  # a zero-width offset (possible after offset trimming): use its position
        return any(a <= start < b for a, b in spans)
    return any(start < b and end > a for a, b in spans)


def tokenize_conversations(tokenizer, conversations: list[list[dict]]) -> list[dict]:
    """Tokenize conversations (batched, fast tokenizer) into `{input_ids, labels}` rows, -100 where untrained:
    the authors' SFT rows with the Instella template, the template's rendering with its generation spans otherwise
    (see the module docstring)."""
    if not conversations:
        return []
    if tokenizer.chat_template == INSTELLA_CHAT_TEMPLATE:
        return _instella_rows(tokenizer, conversations)
    return _template_rows(tokenizer, conversations)


def _instella_rows(tokenizer, conversations: list[list[dict]]) -> list[dict]:
    """BOS, then per message `<|role|>\\n` and its body, each piece tokenized alone (one batched call)."""
    pieces = []
    for messages in conversations:
        for m in messages:
            eos = tokenizer.eos_token if m["role"] == "assistant" else ""
            pieces += [f"<|{m['role']}|>\n", m["content"] + eos + "\n"]
    encoded = iter(tokenizer(pieces, add_special_tokens=False)["input_ids"])
    out = []
    for messages in conversations:
        ids, labels = [tokenizer.bos_token_id], [IGNORE_INDEX]
        for m in messages:
            header, body = next(encoded), next(encoded)
            ids += header + body
            labels += [IGNORE_INDEX] * len(header)
            # assistant: content + EOS trained, the newline after the EOS not
            labels += body[:-1] + [IGNORE_INDEX] if m["role"] == "assistant" else [IGNORE_INDEX] * len(body)
        out.append({"input_ids": ids, "labels": labels})
    return out


def _template_rows(tokenizer, conversations: list[list[dict]]) -> list[dict]:
    """The rendered conversations; a token is trained iff its characters overlap a generation span."""
    texts, all_spans = zip(*(render(tokenizer, m) for m in conversations), strict=True)
    encoded = tokenizer(list(texts), add_special_tokens=False, return_offsets_mapping=True)
    out = []
    for ids, offsets, spans in zip(encoded["input_ids"], encoded["offset_mapping"], all_spans, strict=True):
        labels = [tok if _in_spans(s, e, spans) else IGNORE_INDEX for tok, (s, e) in zip(ids, offsets, strict=True)]
        out.append({"input_ids": list(ids), "labels": labels})
    return out


def tokenize_conversation(tokenizer, messages: list[dict]) -> dict:
    """One conversation -> `{input_ids, labels}` (see `tokenize_conversations`)."""
    return tokenize_conversations(tokenizer, [messages])[0]
