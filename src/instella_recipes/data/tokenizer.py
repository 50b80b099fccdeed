"""Tokenizers with Instella's special-token layout: `<|endoftext|>` is id 0 (BOS and EOS), `<|padding|>` is id 1.

`load_tokenizer` accepts what users have: a Hub id or folder (AutoTokenizer), or a bare `tokenizer.json` such as
the OLMo one in `tests/fixtures/tokenizers/`. `train_bpe_tokenizer` makes the small byte-level BPE that the tiny
recipes use, with the same layout, so every code path that works on it works on the real tokenizer.
"""

from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|padding|>"


def wrap_tokenizer(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A transformers fast tokenizer over a `tokenizers.Tokenizer`, with bos = eos = id 0 and pad = id 1."""
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token=EOS_TOKEN, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN
    )
    if wrapped.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN]) != [0, 1]:
        raise ValueError(f"tokenizer must map {EOS_TOKEN} to id 0 and {PAD_TOKEN} to id 1 (the OLMo layout)")
    return wrapped


def load_tokenizer(name_or_path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer from a `tokenizer.json` file, a local folder or a Hub id."""
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".json":
        return wrap_tokenizer(Tokenizer.from_file(str(path)))
    return AutoTokenizer.from_pretrained(str(name_or_path))


def train_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (the GPT-NeoX/OLMo kind) on `texts`; ids 0 and 1 are EOS/BOS and PAD."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return wrap_tokenizer(tokenizer)
