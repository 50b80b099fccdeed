"""Chat SFT sets -> stage-2 pretraining text (SPEC.md section 2): each message's content stripped plus "\\n", no role
tags, one `{"text": ...}` jsonl row per conversation (the pretraining packer adds EOS between documents).

    python scripts/chat_to_text.py --sources allenai/tulu-3-sft-mixture chats.jsonl --output stage2/tulu3.jsonl

Each source is a Hub id, folder or jsonl/json/parquet file with a `messages` column (or use --converter for the
named converters in instella_recipes/post_training/converters.py). Rows without any non-empty message are skipped and
counted.
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

from instella_recipes.core import atomic_file, exit_on_recipe_error, get_logger, parse_recipe, setup_logging
from instella_recipes.post_training.converters import chat_to_text
from instella_recipes.post_training.mixture import build_mixture

logger = get_logger("instella_recipes.scripts.chat_to_text")


@dataclass
class ChatToTextArgs:
    sources: list[str] = field(default_factory=list, metadata={"help": "Hub ids or files with chat rows."})
    output: str = field(default="", metadata={"help": "Output jsonl path ({'text': ...} per line)."})
    converter: str = field(default="messages", metadata={"help": "Converter name for every source."})
    split: str = field(default="train", metadata={"help": "Split to read from Hub datasets."})


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> Path:
    (args,) = parse_recipe([ChatToTextArgs], argv)
    setup_logging()
    specs = [{"path": s, "split": args.split, "converter": args.converter} for s in args.sources]
    chats, _ = build_mixture(specs, seed=0)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    written, skipped = 0, 0
    with atomic_file(out) as handle:
        for row in chats:
            text = chat_to_text(row["messages"])
            if not text.strip():
                skipped += 1
                continue
            handle.write(json.dumps({"text": text}) + "\n")
            written += 1
    logger.info(f"chat_to_text: wrote {written} documents to {out}; skipped {skipped} empty conversations")
    return out


if __name__ == "__main__":
    main()
