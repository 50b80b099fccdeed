"""Chat SFT sets -> stage-2 pretraining text (`scripts/chat_to_text.py`, SPEC.md section 2): each message's content
stripped plus "\\n", no role tags, one `{"text": ...}` jsonl row per conversation (the pretraining packer adds EOS
between documents).

Sources are read like SFT sources (`post_training/mixture.py`: a Hub id, folder or jsonl/json/parquet file with a
`messages` column, or another shape through a named converter of `post_training/converters.py`). Rows without any
non-empty message are skipped and counted. The authors' own conversion of their six chat sets, row for row, is
`data/chat_text.py` (used by `prepare_data` for the stage-2 token files).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from instella_recipes.core import (
    RecipeError,
    atomic_file,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    setup_logging,
)
from instella_recipes.post_training.converters import chat_to_text
from instella_recipes.post_training.mixture import build_mixture

logger = get_logger(__name__)


@dataclass
class ChatToTextArguments:
    """The settings of `scripts/chat_to_text.py`."""

    sources: list[str] = field(default_factory=list, metadata={"help": "Hub ids or files with chat rows."})
    output: str = field(default="", metadata={"help": "Output jsonl path ({'text': ...} per line)."})
    converter: str = field(default="messages", metadata={"help": "Converter name for every source."})
    split: str = field(default="train", metadata={"help": "Split to read from Hub datasets."})


def write_chat_text(args: ChatToTextArguments) -> Path:
    """Write `args.output` (written aside, then renamed); returns its path."""
    specs = [{"path": s, "split": args.split, "converter": args.converter} for s in args.sources]
    chats, _ = build_mixture(specs, seed=0)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    written, skipped = 0, 0
    with atomic_file(out) as handle:
        for number, row in enumerate(chats):
            try:
                text = chat_to_text(row["messages"])
            except ValueError as err:  # nothing is left behind: atomic_file drops the partial output
                raise RecipeError(
                    f"sources {', '.join(map(str, args.sources))}: row {number} of the mixture ({_opening(row)}): "
                    f"{err}; the "
                    f"'{args.converter}' converter needs system/user/assistant messages with string contents (fix "
                    f"the source, or choose its converter)"
                ) from None
            if not text.strip():
                skipped += 1
                continue
            handle.write(json.dumps({"text": text}) + "\n")
            written += 1
    logger.info(f"chat_to_text: wrote {written} documents to {out}; skipped {skipped} empty conversations")
    return out


def _opening(row: dict) -> str:
    """How a row starts, to find it in its source (the mixture is shuffled: its row number is not the source's)."""
    first = (row.get("messages") or [None])[0]
    content = first.get("content") if isinstance(first, dict) else first
    return f"its first message {str(content)!r:.60}"


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/chat_to_text.py`: parse, then `write_chat_text`; the exit status."""
    (args,) = parse_recipe([ChatToTextArguments], argv)
    setup_logging()
    write_chat_text(args)
    return 0
