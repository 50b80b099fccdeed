"""Parameter counts and FLOPs per token against SPEC.md 6 (Instella-3B) and the analytic formula."""

import pytest
from transformers import LlamaConfig, OlmoeConfig

from instella_recipes.trainer.flops import (
    PEAK_FLOPS,
    count_params_from_config,
    dense_param_count,
    flops_per_token,
    mfu,
    tokens_per_second_at,
)
from modeling_instella import InstellaConfig


def test_instella_3b_counts_and_flops_match_spec():
    config = InstellaConfig()
    counts = count_params_from_config(config)
    assert counts.total == 3_112_675_840
    assert counts.embedding == 128_778_240
    assert counts.active == counts.total and counts.routed_experts == 0
    assert counts.flops_params == 2_983_897_600
    analytic = dense_param_count(
        vocab_size=50304, hidden_size=2560, intermediate_size=6912, num_layers=36, num_heads=32, num_kv_heads=32,
        qk_norm=True,
    )  # fmt: skip
    assert analytic == counts.total
    flops = flops_per_token(config, 4096, counts)
    assert flops == 6 * 2_983_897_600 + 12 * 36 * 32 * 80 * 4096 == 22_433_233_920
    assert round(flops / 1e10, 3) == 2.243
    # SPEC.md 6: 50% MFU on one H200 is ~22,000 tokens/s.
    assert tokens_per_second_at(0.5, flops, "H200") == pytest.approx(22_043, rel=1e-3)
    assert mfu(22_043, flops, "H200") == pytest.approx(0.5, rel=1e-4)
    assert PEAK_FLOPS["MI300X"] == 1307e12


def test_amd_llama_135m_matches_analytic():
    config = LlamaConfig(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=12, tie_word_embeddings=False,
    )  # fmt: skip
    counts = count_params_from_config(config)
    assert counts.total == dense_param_count(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_layers=12, num_heads=12, num_kv_heads=12
    )
    assert 134e6 < counts.total < 135e6


def test_moe_active_counts_only_top_k_of_routed_experts():
    config = OlmoeConfig(
        vocab_size=128, hidden_size=32, intermediate_size=16, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, num_experts=8, num_experts_per_tok=2,
    )  # fmt: skip
    counts = count_params_from_config(config)
    routed = 2 * 8 * 3 * 32 * 16  # layers x experts x (gate, up, down) x hidden x intermediate
    assert counts.routed_experts == routed
    assert counts.active == counts.total - routed + routed * 2 // 8
    assert counts.flops_params == counts.active - 128 * 32  # untied: lm_head counts, input embedding does not


def test_tied_lm_head_still_counts_as_flops():
    config = LlamaConfig(
        vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        tie_word_embeddings=True,
    )  # fmt: skip
    counts = count_params_from_config(config)
    assert counts.tied_embeddings and counts.flops_params == counts.total
