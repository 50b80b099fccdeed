"""The end-to-end half of tests/unit/post_training/test_sft_train.py
(processes, whole runs, oracles); the in-process tests are there.

Tiny SFT end to end (loss falls, the held-out answer format is learned, the output folder is complete), and
padding-free packing giving the same per-token loss as one padded example per row."""

import json

import pytest
from transformers import AutoModelForCausalLM

from instella_recipes.core import read_manifest
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.post_training import sft
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.post_training.tiny_eval import arithmetic_scores
from instella_recipes.trainer.features.optimizer import olmo_lr_factor
from tests.unit.post_training import test_sft_train as unit_half  # fixtures and helpers both halves use

TINY_SFT = unit_half.TINY_SFT
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.slow
def test_tiny_sft_learns_the_answer_format(tiny_model_dir, tmp_path):
    out = tmp_path / "sft"
    tokenizer = install_chat_template(load_tokenizer(tiny_model_dir))
    before = arithmetic_scores(AutoModelForCausalLM.from_pretrained(tiny_model_dir), tokenizer)

    sft.main(["--config", TINY_SFT, "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out)])

    state = json.loads((out / "trainer_state.json").read_text())
    losses = [h["loss"] for h in state["log_history"] if "loss" in h]
    assert losses[-1] < 0.5 * losses[0]
    # the OLMo schedule from the recipe (warmup from 0.1 x peak over 5 steps, linear down to 0.001 x peak); update k
    # runs at the formula at k, as OLMo indexes it (SPEC.md 2.1)
    for h in (h for h in state["log_history"] if "learning_rate" in h):
        factor = olmo_lr_factor(h["step"], warmup_steps=5, total_steps=state["max_steps"], decay="linear",
                                alpha_f=0.001)  # fmt: skip
        assert h["learning_rate"] == pytest.approx(3e-3 * factor, rel=1e-4)
    manifest = read_manifest(out)
    assert manifest["stage"] == "sft" and manifest["data"]["kept"] == 424 and manifest["data"]["skipped"] == {}
    saved = load_tokenizer(out)  # the output folder renders the Instella template on its own
    assert saved.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    ) == ("<|endoftext|><|user|>\nHi\n<|assistant|>\n")
    after = arithmetic_scores(AutoModelForCausalLM.from_pretrained(out), saved)
    # held-out problems (operand pairs never seen in training): "a + b = c. The answer is c." then EOS
    assert before["format"] == 0.0 and after["format"] >= 0.8
    assert after["operands"] > before["operands"]
