"""The "mitchell" init (SPEC.md 1): fan-in sigma, depth-scaled output projections, truncation at 3 sigma."""

import math

import torch

from instella_recipes.pretraining.initialization import init_mitchell
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


def test_mitchell_init_stds_and_bounds():
    config = tiny_config(hidden_size=64, intermediate_size=256, vocab_size=4096, num_hidden_layers=2)
    model = init_mitchell(InstellaForCausalLM(config), generator=torch.Generator().manual_seed(0))
    params = dict(model.named_parameters())

    def check(name, std):
        w = params[name]
        assert w.abs().max() <= 3 * std + 1e-7, name
        # a normal truncated at 3 sigma has std 0.9866 sigma
        assert abs(w.std().item() / (0.9866 * std) - 1) < 0.08, (name, w.std().item(), std)

    check("model.embed_tokens.weight", 1 / math.sqrt(64))
    check("lm_head.weight", 1 / math.sqrt(64))
    check("model.layers.0.self_attn.q_proj.weight", 1 / math.sqrt(64))
    check("model.layers.1.mlp.up_proj.weight", 1 / math.sqrt(64))
    check("model.layers.0.self_attn.o_proj.weight", 1 / math.sqrt(64) / math.sqrt(2))
    check("model.layers.1.self_attn.o_proj.weight", 1 / math.sqrt(64) / math.sqrt(4))
    check("model.layers.1.mlp.down_proj.weight", 1 / math.sqrt(256) / math.sqrt(4))
    assert torch.equal(params["model.layers.0.self_attn.q_norm.weight"], torch.ones(64))
    assert torch.equal(params["model.norm.weight"], torch.ones(64))
