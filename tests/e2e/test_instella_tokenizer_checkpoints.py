"""The end-to-end half of tests/unit/data/test_instella_tokenizer.py: a pretraining run on the authors' tokenizer saves
it with the model and every checkpoint, and each loads to the authors' ids."""

import json

import numpy as np
from transformers import AutoTokenizer

from instella_recipes.data.tokenizer import load_tokenizer
from tests.helpers.pretrain_utils import TINY_MODEL
from tests.helpers.token_file_utils import token_argv
from tests.unit.data.test_instella_tokenizer import ROOT, TOKENIZER, _check_ids


def test_pretraining_saves_the_authors_tokenizer_with_every_checkpoint(tmp_path):
    from instella_recipes.pretraining.pretrain import main

    rng = np.random.default_rng(0)
    files = tmp_path / "tokens"
    files.mkdir()
    rng.integers(2, 50280, 16 * 9).astype("<u2").tofile(files / "part-00-00000.npy")
    out = tmp_path / "run"
    model = json.dumps({**TINY_MODEL, "vocab_size": 50304})
    # one epoch, as the authors' `max_duration: 1ep`: 9 instances of 16 tokens make 2 whole global batches of 4
    argv = token_argv(files / "part-00-00000.npy", ROOT / TOKENIZER, out, model_config=model, max_steps=-1,
                      num_train_epochs=1, save_steps=1, global_batch_size=4)  # fmt: skip
    assert main(argv) == 0
    assert json.loads((out / "manifest.json").read_text())["global_step"] == 2
    text = "Instella <|endoftext|> |||EMAIL_ADDRESS||| x"
    authors = load_tokenizer(ROOT / TOKENIZER)
    for folder in (out, out / "checkpoint-1", out / "checkpoint-2"):
        for tokenizer in (load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)):  # post-training / release
            _check_ids(tokenizer)
            assert tokenizer(text)["input_ids"] == authors(text)["input_ids"]
        config = json.loads((folder / "config.json").read_text())
        assert (config["eos_token_id"], config["pad_token_id"]) == (0, 1)
