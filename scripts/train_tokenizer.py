"""Make the tokenizer a pipeline trains with: `python scripts/train_tokenizer.py --config recipes/tiny/tokenizer.yaml
--corpus runs/demo/data/corpus.jsonl --output_dir runs/demo/tokenizer`.

Either trains a byte-level BPE on the corpus (`instella_recipes/data/tokenizer.py:train_bpe_tokenizer`: the OLMo
layout, id 0
`<|endoftext|>` = BOS = EOS, id 1 `<|padding|>` = PAD) or, with `pretrained: <tokenizer.json | folder | Hub id>`,
saves that tokenizer instead (e.g. the OLMo one Instella uses). Either way the output is a `save_pretrained` folder
and `manifest.json` records which it was.
"""

try:
    from instella_recipes.data.tokenizer import main
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
