"""The end-to-end half of tests/unit/modeling/test_modeling_features.py (slow: torch.compile): the training forward
compiles as one graph and gives the eager loss."""

import pytest
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


CASES = [("eager", None), ("sdpa", None), ("sdpa", "cu_seq_lens"), ("flex_attention", "position_ids"),
         ("flex_attention", "cu_seq_lens")]  # fmt: skip


@pytest.mark.parametrize("checkpointing", [False, True])
@pytest.mark.parametrize(("attn", "documents"), CASES)
def test_training_forward_has_no_graph_break(attn, documents, checkpointing):
    """torch._dynamo.explain over the training forward (loss included): one graph, no break, for each attention
    implementation, with packed documents (flex: the block-sparse mask) and with activation checkpointing."""
    torch._dynamo.reset()
    model = tiny_model(seed=2).train()
    model.set_attn_implementation(attn)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    ids = torch.randint(2, 512, (1, 32))
    kwargs = {}
    if documents == "position_ids":
        kwargs["position_ids"] = torch.cat([torch.arange(12), torch.arange(20)])[None]
    elif documents == "cu_seq_lens":
        kwargs["cu_seq_lens_q"] = kwargs["cu_seq_lens_k"] = torch.tensor([0, 12, 32], dtype=torch.int32)
    # flex_attention has no backward on CPU (torch refuses inputs that require grad): its forward is traced without
    # autograd, the same Python code; the GPU compiles it with gradients (benchmarks/bench_gpu.py `documents`)
    with torch.set_grad_enabled(attn != "flex_attention"):
        explanation = torch._dynamo.explain(model)(input_ids=ids, labels=ids, **kwargs)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("documents", ["position_ids", "cu_seq_lens"])
def test_compiled_flex_keeps_documents_apart(documents):
    """Inside a compiled forward the flex document mask is built in the graph (not through transformers'
    `create_block_mask(_compile=True)`, a graph break): its logits equal each document run alone (sdpa)."""
    torch._dynamo.reset()
    model = tiny_model(seed=2)
    lengths = (12, 20)
    ids = torch.randint(2, 512, (1, sum(lengths)))
    if documents == "position_ids":
        kwargs = {"position_ids": torch.cat([torch.arange(n) for n in lengths])[None]}
    else:
        kwargs = {"cu_seq_lens_q": torch.tensor([0, 12, 32], dtype=torch.int32)}
        kwargs["cu_seq_lens_k"] = kwargs["cu_seq_lens_q"]
    with torch.no_grad():  # flex has no backward on CPU
        alone = torch.cat([model(part, use_cache=False).logits for part in ids.split(lengths, dim=1)], dim=1)
        model.set_attn_implementation("flex_attention")
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        packed = compiled(input_ids=ids, use_cache=False, **kwargs).logits
    assert (packed - alone).abs().max() < 1e-4
