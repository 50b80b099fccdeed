"""Sequence parallelism in one process: the bad inputs, each rank's chunk and targets, the authors' fallback choice.
The collectives (2 and 4 gloo processes) are tested in tests/e2e/test_sequence_parallel_gloo.py."""

import pytest
import torch

from instella_recipes.trainer.features import sequence_parallel as spm
from instella_recipes.trainer.features.sequence_parallel import SequenceParallel, check_sequence_parallel
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config
from tests.helpers.flex_uncompiled import use_uncompiled_flex


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(seq_len=10, world_size=4, size=4), "seq_len 10 is not divisible by sequence_parallel_size 4"),
        (dict(seq_len=16, world_size=6, size=4), "does not divide the world size (6 processes)"),
        (dict(seq_len=16, world_size=4, size=4, micro_batch=2), "per_device_train_batch_size 2"),
        (dict(seq_len=16, world_size=8, size=8), "does not divide the model's attention heads (4 query"),
    ],
)
def test_bad_sequence_parallel_inputs_are_one_clear_message(kwargs, message):
    with pytest.raises(ValueError) as err:
        check_sequence_parallel(config=tiny_config(), **kwargs)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_good_sequence_parallel_inputs_pass():
    check_sequence_parallel(4, 16, 8, tiny_config())
    check_sequence_parallel(1, 7, 3, tiny_config(), micro_batch=4)  # SP off: nothing to check


def _rank(size, rank, mode, force=False):
    sp = SequenceParallel(size, mode, force)
    sp.rank = rank  # one process plays each rank (no group: nothing is exchanged by shard)
    return sp


def test_exact_chunks_keep_every_target_of_the_row():
    ids = torch.arange(10, 18)[None]
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4]])
    shards = [_rank(2, r, "exact").shard({"input_ids": ids, "labels": ids, "position_ids": positions}) for r in (0, 1)]
    assert torch.equal(torch.cat([s["input_ids"] for s in shards], 1), ids)
    assert torch.equal(torch.cat([s["position_ids"] for s in shards], 1), positions)
    targets = torch.cat([s["shift_labels"] for s in shards], 1)
    assert targets.tolist() == [[11, 12, 13, 14, 15, 16, 17, -100]]  # the border token 13 keeps its target


def test_authors_chunks_shift_inside_the_chunk_and_fall_back_only_for_short_documents():
    ids = torch.arange(10, 18)[None]
    short = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0]])  # longest document 4 <= 8 / 2: chunk-local attention
    sp = _rank(2, 1, "authors")
    out = sp.shard({"input_ids": ids, "labels": ids, "position_ids": short})
    assert "shift_labels" not in out and out["labels"].tolist() == [[14, 15, 16, 17]]
    assert sp.local and sp.segment_lengths(local=True).tolist() == [3, 1]  # the straddling document is cut
    assert sp.mask(local=True).shape == (1, 1, 4, 4)
    long = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2]])  # a 5-token document spans the border: the Ulysses path
    sp.shard({"input_ids": ids, "labels": ids, "position_ids": long})
    assert not sp.local and sp.segment_lengths(local=False).tolist() == [5, 3]
    forced = _rank(2, 1, "authors", force=True)  # SFT's force_sequence_parallel
    forced.shard({"input_ids": ids, "labels": ids, "position_ids": short})
    assert not forced.local


def test_rows_the_split_cannot_take_are_refused():
    sp = _rank(2, 0, "exact")
    with pytest.raises(ValueError, match="SP takes one packed row per micro-step"):
        sp.shard({"input_ids": torch.zeros(2, 8, dtype=torch.long)})
    with pytest.raises(ValueError, match="a row of 7 is not divisible by sequence_parallel_size 2"):
        sp.shard({"input_ids": torch.zeros(1, 7, dtype=torch.long)})
    with pytest.raises(ValueError, match="padding-free"):
        sp.shard({"input_ids": torch.zeros(1, 8, dtype=torch.long), "attention_mask": torch.tensor([[1] * 7 + [0]])})
    with pytest.raises(ValueError, match="sequence_parallel_mode 'ring'"):
        SequenceParallel(2, "ring")


def test_varlen_boundaries_stand_for_position_ids_and_are_not_passed_on():
    """A padding-free collator's flash kwargs (TRL, DataCollatorWithFlattening) describe the row, not a chunk."""
    ids = torch.arange(10, 18)[None]
    sp = _rank(2, 0, "exact")
    out = sp.shard({"input_ids": ids, "labels": ids, "cu_seq_lens_q": torch.tensor([0, 3, 8]), "max_length_q": 5})
    assert "cu_seq_lens_q" not in out and "max_length_q" not in out
    assert out["position_ids"].tolist() == [[0, 1, 2, 0]] and sp.segment_lengths(local=False).tolist() == [3, 5]


@pytest.mark.parametrize("local", [False, True])
def test_flex_inner_attention_gets_the_same_document_mask_as_sdpa(local, monkeypatch):
    """Inside the Ulysses wrapper flex_attention gets the row's (or the chunk's) documents as a block-sparse mask
    and computes what sdpa computes with the dense one. Uncompiled flex (the compiled kernel is the GPU's)."""
    use_uncompiled_flex(monkeypatch)
    sp = _rank(2, 0, "exact")
    sp.shard({"input_ids": torch.zeros(1, 16, dtype=torch.long),
              "position_ids": torch.cat([torch.arange(5), torch.arange(7), torch.arange(4)])[None]})  # fmt: skip
    module = InstellaForCausalLM(tiny_config()).model.layers[0].self_attn
    length = 8 if local else 16
    q, k, v = (torch.randn(1, 4, length, 16) for _ in range(3))
    outputs = {}
    for name in ("sdpa", "flex_attention"):
        # private: the wrapper reads the config's attention name, as transformers' models do [test_private_apis]
        module.config._attn_implementation = spm.ATTENTION_PREFIX + name
        outputs[name], _ = spm._inner(module, q, k, v, sp, local, {})
    assert (outputs["sdpa"] - outputs["flex_attention"]).abs().max() < 1e-5
    assert spm.ulysses_attention.handles_documents  # the model passes packed rows to the wrapper
