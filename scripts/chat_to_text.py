"""Chat SFT sets -> stage-2 pretraining text (SPEC.md section 2): each message's content stripped plus "\\n", no role
tags, one `{"text": ...}` jsonl row per conversation (the pretraining packer adds EOS between documents).

    python scripts/chat_to_text.py --sources allenai/tulu-3-sft-mixture chats.jsonl --output stage2/tulu3.jsonl

Each source is a Hub id, folder or jsonl/json/parquet file with a `messages` column (or use --converter for the
named converters in instella_recipes/post_training/converters.py). Rows without any non-empty message are skipped and
counted.
"""

try:
    from instella_recipes.post_training.chat_to_text import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    raise SystemExit(main())
