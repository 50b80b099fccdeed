"""The end-to-end half of tests/unit/modeling/test_modeling_features.py (slow: torch.compile): the training forward
compiles as one graph and gives the eager loss."""

import torch

from tests.unit.modeling.test_modeling_features import tiny_model


def test_training_forward_compiles_fullgraph():
    torch._dynamo.reset()
    model = tiny_model(seed=2).train()
    ids = torch.randint(2, 512, (2, 16))
    position_ids = torch.arange(16).repeat(2, 1)
    eager_loss = model(ids, labels=ids, position_ids=position_ids).loss
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    loss = compiled(ids, labels=ids, position_ids=position_ids).loss  # fullgraph: a graph break raises
    loss.backward()
    assert torch.allclose(loss, eager_loss, atol=1e-5)
    assert all(p.grad is not None for p in model.parameters())
