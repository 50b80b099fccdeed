"""Make the tokenizer a pipeline trains with: `python scripts/train_tokenizer.py --config recipes/tiny/tokenizer.yaml
--corpus runs/demo/data/corpus.jsonl --output_dir runs/demo/tokenizer`.

Either trains a byte-level BPE on the corpus (`instella_recipes/data/tokenizer.py:train_bpe_tokenizer`: the OLMo
layout, id 0
`<|endoftext|>` = BOS = EOS, id 1 `<|padding|>` = PAD) or, with `pretrained: <tokenizer.json | folder | Hub id>`,
saves that tokenizer instead (e.g. the OLMo one Instella uses). Either way the output is a `save_pretrained` folder
and `manifest.json` records which it was.
"""

from instella_recipes.data.tokenizer import main

if __name__ == "__main__":
    raise SystemExit(main())
