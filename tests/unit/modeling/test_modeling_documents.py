"""Packed documents never see each other: every attention implementation masks them (equal to each document run
alone) or refuses them with one line; flex_attention gets transformers' block-sparse document mask, in training and
in an evaluation prefill with a KV cache; `attn_implementation="flash_or_flex"` picks what is installed."""

import pytest
import torch
from transformers import AttentionInterface, DataCollatorWithFlattening, DynamicCache
from transformers.masking_utils import BlockMask
from transformers.utils import is_flash_attn_2_available

import modeling_instella.modeling_instella as modeling
from tests.helpers.flex_uncompiled import use_uncompiled_flex
from tests.unit.modeling.test_modeling_features import tiny_model

LENGTHS = (7, 12, 5)


@pytest.fixture
def flex_uncompiled(monkeypatch):
    use_uncompiled_flex(monkeypatch)


def packed_documents(seed=0):
    torch.manual_seed(seed)
    docs = [torch.randint(2, 512, (n,)) for n in LENGTHS]
    positions = torch.cat([torch.arange(n) for n in LENGTHS])[None]
    return docs, torch.cat(docs)[None], positions


def alone_logits(model, docs):
    with torch.no_grad():
        return torch.cat([model(d[None], use_cache=False).logits[0] for d in docs])


@pytest.mark.parametrize("attn", ["eager", "sdpa", "flex_attention"])
@pytest.mark.parametrize("given", ["cu_seq_lens", "position_ids"])
def test_documents_equal_each_document_alone(attn, given, flex_uncompiled):
    model = tiny_model()
    model.set_attn_implementation(attn)
    docs, packed, positions = packed_documents()
    if given == "cu_seq_lens":  # DataCollatorWithFlattening's flash kwargs: positions run over the whole row
        batch = DataCollatorWithFlattening(return_position_ids=False, return_flash_attn_kwargs=True)(
            [{"input_ids": d.tolist()} for d in docs]
        )
        kwargs = {"cu_seq_lens_q": batch["cu_seq_lens_q"], "cu_seq_lens_k": batch["cu_seq_lens_k"]}
    else:
        kwargs = {"position_ids": positions}
    alone = alone_logits(model, docs)
    with torch.no_grad():
        for training in (True, False):  # training: no cache; evaluation: an (empty) KV cache is made
            model.train(training)
            logits = model(packed, **kwargs).logits[0]
            assert (logits - alone).abs().max() < 1e-5, (training, (logits - alone).abs().max())
        crossing = model(packed, use_cache=False).logits[0]
    assert (crossing - alone).abs().max() > 1e-3  # without the mask the documents would see each other


def test_flex_gets_a_block_sparse_mask(flex_uncompiled):
    """The mask flex_attention receives is a BlockMask (only the diagonal documents' blocks), never a dense one."""
    model = tiny_model()
    model.set_attn_implementation("flex_attention")
    docs, packed, positions = packed_documents()
    documents = model.model._documents(None, positions, None, None, packed)
    assert documents.tolist() == [[0] * 7 + [1] * 12 + [2] * 5]
    mask = model.model._document_mask(documents, False, None, None, torch.float32)
    assert isinstance(mask, BlockMask)
    dense = mask.to_dense() if hasattr(mask, "to_dense") else None
    assert dense is not None and dense.shape[-2:] == (1, 1)  # 24 tokens: one 128-token block
    allowed = torch.ones(24, 24, dtype=torch.bool).tril() & (documents[0][:, None] == documents[0][None, :])
    idx = torch.arange(24)
    assert torch.equal(mask.mask_mod(0, 0, idx[:, None], idx[None, :]), allowed)


def test_evaluation_prefill_with_a_cache_masks_documents_then_decodes():
    """lm-eval style: a packed prefill into a KV cache (transformers skips its packed detection there) equals the
    documents alone; the next decoding step reads the whole cache as transformers does (the last document goes on)."""
    model = tiny_model()
    docs, packed, positions = packed_documents()
    alone = alone_logits(model, docs)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        logits = model(packed, position_ids=positions, past_key_values=cache, use_cache=True).logits[0]
    assert (logits - alone).abs().max() < 1e-5
    assert cache.get_seq_length() == packed.shape[1]


def test_unknown_attention_refuses_documents_in_one_line():
    def plain(module, query, key, value, attention_mask, **kwargs):
        return AttentionInterface._global_mapping["sdpa"](module, query, key, value, None, **kwargs)

    AttentionInterface.register("plain_no_mask", plain)
    model = tiny_model()
    model.set_attn_implementation("plain_no_mask")
    docs, packed, positions = packed_documents()
    with pytest.raises(ValueError, match=r"^attn_implementation='plain_no_mask' cannot keep packed documents apart"):
        model(packed, position_ids=positions, use_cache=False)
    with torch.no_grad():  # one document: nothing to refuse
        model(docs[0][None], position_ids=torch.arange(7)[None], use_cache=False)
    plain.handles_documents = True  # a wrapper that masks documents itself (the Ulysses SP wrapper) passes
    model(packed, position_ids=positions, use_cache=False)


def test_flash_refuses_position_restarts_in_a_batch_of_rows():
    """transformers' flash path reads position_ids restarts only in a batch of one row: more rows would mix."""
    model = tiny_model()
    # private: set directly, flash-attn is not installed on CPU (the mask decision needs no kernel) [test_private_apis]
    model.config._attn_implementation = "flash_attention_2"
    docs, packed, positions = packed_documents()
    documents = model.model._documents(None, positions.repeat(2, 1), None, None, packed.repeat(2, 1))
    with pytest.raises(ValueError, match="a batch of more than one row"):
        model.model._document_mask(documents, False, None, None, torch.float32)
    assert model.model._document_mask(documents[:1], False, None, None, torch.float32) is None
    assert model.model._document_mask(documents, True, None, None, torch.float32) is None  # varlen kernels


def test_flash_or_flex_picks_the_installed_one():
    model = tiny_model(attn_implementation=modeling.FLASH_OR_FLEX)
    expected = "flash_attention_2" if is_flash_attn_2_available() else "flex_attention"
    # private: the resolved name, as transformers' models read it [test_private_apis]
    assert model.config._attn_implementation == expected


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex_attention's backward is not implemented on CPU")
def test_flex_document_gradients_equal_each_document_alone_on_gpu():
    """The packed row's summed loss has the gradients of the documents' summed losses (fp32, compiled flex)."""
    docs, packed, positions = packed_documents()
    grads = []
    for pack in (True, False):
        model = tiny_model().cuda().train()
        model.set_attn_implementation("flex_attention")
        rows = [(packed, positions)] if pack else [(d[None], torch.arange(len(d))[None]) for d in docs]
        for ids, pos in rows:
            logits = model(ids.cuda(), position_ids=pos.cuda()).logits[0, :-1]
            targets = ids.cuda()[0, 1:].clone()
            if pack:  # no target across a document border, as each document alone has none
                targets[torch.tensor(LENGTHS).cumsum(0)[:-1].cuda() - 1] = -100
            torch.nn.functional.cross_entropy(logits, targets, reduction="sum").backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.allclose(grad, grads[1][name], rtol=1e-3, atol=1e-4), name
