"""Speculative decoding (scripts/speculative.py): counts read from transformers' candidate generator, the draft =
target
identity, the published vocab padding (draft vocab < target vocab), execution-based pass@1, and bad input."""

import json

import pytest
import torch
from instella_recipes.scripts import speculative as spec
from transformers import LlamaConfig, LlamaForCausalLM

from instella_recipes.data.tokenizer import train_bpe_tokenizer

MAX_NEW = 12


def _llama(folder, tokenizer, vocab_size, seed, hidden=32):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pair(tmp_path_factory, tiny_tokenizer):
    """A tiny Llama target (vocab padded by 16 ids, like CodeLlama's 32016 vs 32000) and a smaller random draft."""
    root = tmp_path_factory.mktemp("spec")
    target = _llama(root / "target", tiny_tokenizer, len(tiny_tokenizer) + 16, seed=0, hidden=48)
    draft = _llama(root / "draft", tiny_tokenizer, len(tiny_tokenizer), seed=1)
    return target, draft


def test_draft_equal_to_target_accepts_every_token_and_keeps_greedy_output(pair):
    target_dir, _ = pair
    target, draft, tok = spec.load_pair(target_dir, target_dir)
    # draft 4 tokens per round, never stopping early on low draft confidence (fewer rounds, same property)
    draft.generation_config.num_assistant_tokens, draft.generation_config.assistant_confidence_threshold = 4, 0.0
    prompts = spec.load_prompts(spec.DEFAULT_PROMPTS, limit=2)
    no_eos = {"eos_token_id": None}
    result = spec.run_mode(target, draft, tok, prompts, "greedy", MAX_NEW, gen_overrides=no_eos, execute=False)
    assert result.counts.drafted >= 2 * (MAX_NEW - 4)  # per prompt: all but the bonus tokens were drafted
    assert result.counts.accepted == result.counts.drafted
    assert result.identical == result.prompts == 2
    assert result.new_tokens_base == result.new_tokens_assisted == 2 * MAX_NEW

    sampled = spec.run_mode(target, draft, tok, prompts[:1], "sampled", MAX_NEW, gen_overrides=no_eos, execute=False)
    assert sampled.counts.drafted > 0 and sampled.counts.accepted == sampled.counts.drafted


def test_smaller_vocab_draft_is_padded_and_greedy_output_stays_the_targets(pair):
    target_dir, draft_dir = pair
    target, draft, tok = spec.load_pair(target_dir, draft_dir)
    assert draft.config.vocab_size == target.config.vocab_size == len(tok) + 16
    logits = draft(torch.tensor([[5, len(tok) + 3]])).logits  # a target-only id goes in, padded logits come out
    assert logits.shape[-1] == len(tok) + 16
    assert torch.isinf(logits[..., len(tok) :]).all() and torch.isfinite(logits[..., : len(tok)]).all()
    draft.generation_config.num_assistant_tokens, draft.generation_config.assistant_confidence_threshold = 3, 0.0
    prompts = spec.load_prompts(spec.DEFAULT_PROMPTS, limit=1)
    result = spec.run_mode(target, draft, tok, prompts, "greedy", MAX_NEW, execute=False)
    assert result.identical == 1  # assisted greedy is exact whatever the draft proposes
    assert 0 <= result.counts.accepted <= result.counts.drafted
    summary = result.summary()
    assert summary["acceptance_rate"] == result.counts.accepted / result.counts.drafted
    assert "| greedy |" in spec.format_markdown([summary])


def test_pass_at_1_executes_completions_with_a_time_limit():
    problems = spec.load_prompts(spec.DEFAULT_PROMPTS)
    assert len(problems) >= 10
    assert all(spec.passes(p, p["canonical_solution"]) for p in problems[:3])
    assert not spec.passes(problems[0], "    return None\n")
    assert not spec.passes(problems[0], "    while True:\n        pass\n", timeout=1.0)
    assert spec.truncate_completion("    return a + b\n\ndef other():\n    pass") == "    return a + b\n"


def test_bad_inputs_fail_before_any_weights_are_read(pair, tmp_path):
    target_dir, draft_dir = pair
    with pytest.raises(spec.SpeculativeError, match="not found"):
        spec.load_pair(tmp_path / "missing", draft_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(spec.SpeculativeError, match="no config.json"):
        spec.load_pair(target_dir, tmp_path / "empty")

    # A draft whose tokenizer numbers tokens differently; its weights file is garbage, so reaching it would fail
    # with a safetensors error instead of ours.
    other_tok = train_bpe_tokenizer(["completely different text " * 50, "zebra quartz yodel " * 50], vocab_size=300)
    bad = _llama(tmp_path / "bad", other_tok, len(other_tok), seed=2)
    (bad / "model.safetensors").write_bytes(b"not weights")
    with pytest.raises(spec.SpeculativeError, match="tokenizer is incompatible"):
        spec.load_pair(target_dir, bad)
    assert spec.main(["--target", str(target_dir), "--draft", str(bad)]) == 2

    bigger = _llama(tmp_path / "bigger", other_tok, 4096, seed=3)
    with pytest.raises(spec.SpeculativeError, match="draft vocab_size 4096 > target"):
        spec.load_pair(target_dir, bigger)

    broken = tmp_path / "prompts.jsonl"
    broken.write_text(json.dumps({"task_id": "x", "prompt": "def f():\n"}) + "\n")
    with pytest.raises(spec.SpeculativeError, match="missing fields"):
        spec.load_prompts(broken)
