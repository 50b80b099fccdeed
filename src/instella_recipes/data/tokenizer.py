"""Tokenizers with Instella's special-token layout: `<|endoftext|>` is id 0 (BOS and EOS), `<|padding|>` is id 1.

`load_tokenizer` accepts what users have: a Hub id or folder (AutoTokenizer), or a bare `tokenizer.json` such as
the OLMo one in `tests/fixtures/tokenizers/`. `train_bpe_tokenizer` makes the small byte-level BPE that the tiny
recipes use, with the same layout, so every code path that works on it works on the real tokenizer.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from instella_recipes.core import (
    RecipeError,
    check_output_dir,
    check_range,
    claim_output_dir,
    exit_on_recipe_error,
    file_digest,
    iter_jsonl,
    parse_recipe,
    setup_logging,
    write_manifest,
)
from instella_recipes.weights import check_tokenizer_path

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
    """Load a tokenizer from a `tokenizer.json` file, a local folder or a Hub id. A local path that does not exist
    is named as such (not the Hub's "Repo id must be in the form" message), a Hub id that does not resolve in one
    line (`weights.check_tokenizer_path`)."""
    path = Path(name_or_path)
    if path.is_file() and path.suffix == ".json":
        return wrap_tokenizer(Tokenizer.from_file(str(path)))
    check_tokenizer_path(name_or_path, "tokenizer")
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


# --- the stage (scripts/train_tokenizer.py) -------------------------------------------------------------------------
@dataclass
class TokenizerArguments:
    """The settings of `scripts/train_tokenizer.py`: train a BPE on `corpus`, or save `pretrained` as is."""

    output_dir: str = field(metadata={"help": "folder for the tokenizer files and the manifest"})
    corpus: list[str] = field(default_factory=list, metadata={"help": "jsonl files to train on"})
    text_column: str = field(default="text", metadata={"help": "the text field of each jsonl row"})
    vocab_size: int = field(default=1024, metadata={"help": "BPE vocabulary size, special tokens included"})
    pretrained: str | None = field(
        default=None, metadata={"help": "use this tokenizer (tokenizer.json, folder or Hub id) instead of training"}
    )
    overwrite: bool = field(default=False, metadata={"help": "replace a complete output in output_dir"})

    def __post_init__(self):
        check_range("vocab_size", self.vocab_size, 1, integer=True)


def read_texts(paths: list[str], column: str) -> list[str]:
    """Every row's text, with a clear error naming the file and line of a bad row."""
    texts = []
    for path in paths:
        if not Path(path).is_file():
            raise RecipeError(f"corpus file {path} does not exist")
        for number, row in iter_jsonl(path):
            if not isinstance(row.get(column), str):
                raise RecipeError(f"{path}:{number}: no text column '{column}' (set text_column)")
            texts.append(row[column])
    if not texts:
        raise RecipeError(f"no text found in {paths}: nothing to train the tokenizer on")
    return texts


def make_tokenizer(args: TokenizerArguments) -> Path:
    """A `save_pretrained` folder in `args.output_dir`, then `manifest.json` saying which tokenizer it is; returns the
    manifest path."""
    check_output_dir(args.output_dir, args.overwrite)
    if args.pretrained:
        tokenizer = load_tokenizer(args.pretrained)
        source = {"kind": "pretrained", "source": args.pretrained}
    else:
        if not args.corpus:
            raise RecipeError("set corpus (jsonl files to train on) or pretrained (a tokenizer to use as is)")
        texts = read_texts(args.corpus, args.text_column)
        tokenizer = train_bpe_tokenizer(texts, vocab_size=args.vocab_size)
        source = {
            "kind": "trained byte-level BPE",
            "corpus": {path: file_digest(path) for path in args.corpus},
            "documents": len(texts),
            "requested_vocab_size": args.vocab_size,
        }
    ids = tokenizer.convert_tokens_to_ids([EOS_TOKEN, PAD_TOKEN])
    if ids != [0, 1]:
        raise RecipeError(f"{args.pretrained}: {EOS_TOKEN} and {PAD_TOKEN} must be ids 0 and 1 (got {ids})")
    output = claim_output_dir(args.output_dir, args.overwrite)  # a complete output is replaced only with --overwrite
    output.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(output)
    print(f"tokenizer ({source['kind']}): {len(tokenizer)} ids -> {output}")
    return write_manifest(
        output,
        "tokenizer",
        tokenizer=source | {"vocab_size": len(tokenizer), "sha256": file_digest(output / "tokenizer.json")},
    )


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/train_tokenizer.py`: parse, then `make_tokenizer`; the exit status."""
    (args,) = parse_recipe([TokenizerArguments], argv)
    setup_logging()
    make_tokenizer(args)
    return 0
