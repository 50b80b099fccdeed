# ruff: noqa: E501, W293
"""The authors' SP input split, test-only oracle (never shipped in the library).

`get_sequence_parallel_inputs` below is copied verbatim from AMD-AIG-AIMA/Instella, branch `instella-long`, commit
560ebe7 (2025-06-11), file `instella/train.py` L803-867 (a method of their `Trainer`). Only its surroundings are ours:
`AuthorsSplit` gives it the `self.cfg.force_sequence_parallel` and `self.seq_parallel_group` it reads, and `dist` is a
stand-in answering `get_world_size` / `get_rank` / `is_initialized` for that group (their code calls
`torch.distributed`; here the group is described by (rank, size), so the split can be computed in one process).
"""

from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class _Group:
    rank: int
    size: int


class _Dist:
    """What their function asks torch.distributed about its SP group."""

    @staticmethod
    def get_world_size(group):
        return group.size

    @staticmethod
    def get_rank(group):
        return group.rank

    @staticmethod
    def is_initialized():
        return True


dist = _Dist()


@dataclass
class _Cfg:
    force_sequence_parallel: bool


class AuthorsSplit:
    """`AuthorsSplit(rank, size, force).get_sequence_parallel_inputs({"input_ids", "doc_lens", "max_doc_lens"})`:
    what rank `rank` of an SP group of `size` trains on (`seq_parallel_group` None = the chunk-local fallback)."""

    def __init__(self, rank: int, size: int, force: bool = False):
        self.cfg = _Cfg(force)
        self.seq_parallel_group = _Group(rank, size)

    # ---- verbatim from instella/train.py L803-867 (instella-long, 560ebe7) ----
    # fmt: off
    def get_sequence_parallel_inputs(self, inputs):
        assert inputs["input_ids"].shape[0] == 1 and inputs["doc_lens"].shape[0] == 1, "Multi-sequence sequence parallel is not supported"
        inputs["input_ids"] = inputs["input_ids"].squeeze(0)
        inputs["doc_lens"] = inputs["doc_lens"].squeeze(0)

        seq_parallel_world_size = dist.get_world_size(self.seq_parallel_group)

        assert dist.is_initialized() and seq_parallel_world_size > 1

        seq_parallel_rank = dist.get_rank(self.seq_parallel_group)

        input_ids = inputs["input_ids"]

        doc_lens = inputs["doc_lens"]
        max_doc_lens = inputs["max_doc_lens"]

        assert input_ids.size(-1) % seq_parallel_world_size == 0, "input_ids size should be evenly divided by seq_parallel_world_size"

        if "label_mask" in inputs:
            label_mask = inputs["label_mask"].squeeze(0)
            label_mask_chunks = torch.tensor_split(label_mask, seq_parallel_world_size, dim=-1)
        else:
            label_mask_chunks = None

        input_ids_chunks = torch.tensor_split(input_ids, seq_parallel_world_size, dim=-1)

        inputs = {
            "input_ids": input_ids_chunks[seq_parallel_rank],
            "doc_lens": doc_lens,
            "max_doc_lens": max_doc_lens,
            "seq_parallel_group": self.seq_parallel_group,
        }

        if label_mask_chunks is not None:
            inputs["label_mask"] = label_mask_chunks[seq_parallel_rank]

        max_seq_length = doc_lens.max()
        max_tokens_per_device = doc_lens.sum() // seq_parallel_world_size

        start_index = sum(chunk.size(-1) for chunk in input_ids_chunks[:seq_parallel_rank])
        end_index = start_index + input_ids_chunks[seq_parallel_rank].size(-1)

        inputs["seqlen_offset"] = start_index

        # max sequence length is smaller per device => no need for sequence parallelism
        if max_seq_length <= max_tokens_per_device and not self.cfg.force_sequence_parallel:
            # take the seq length field and only retain seq lengths with indices that are valid for this rank
            seq_indices = doc_lens.cumsum(-1)
            seq_indices = seq_indices[(seq_indices < end_index) & (seq_indices >= start_index)]

            start_index_tensor = torch.tensor([start_index], device=seq_indices.device)
            end_index_tensor = torch.tensor([end_index], device=seq_indices.device)

            doc_lens = seq_indices.diff(prepend=start_index_tensor, append=end_index_tensor)
            doc_lens = doc_lens[doc_lens > 0]
            inputs["doc_lens"] = doc_lens
            inputs["max_doc_lens"] = [int(doc_lens.max())]
            inputs["seq_parallel_group"] = None
        
        inputs["input_ids"] = inputs["input_ids"].unsqueeze(0)
        inputs["doc_lens"] = inputs["doc_lens"].unsqueeze(0)
        if label_mask_chunks is not None:
            inputs["label_mask"] = inputs["label_mask"].unsqueeze(0)

        return inputs
    # fmt: on
    # ---- end of the verbatim copy ----


def authors_split(input_ids: torch.Tensor, doc_lens: list[int], rank: int, size: int, force: bool = False) -> Any:
    """Their split of one packed row for `rank` of `size`."""
    lens = torch.tensor([doc_lens])
    inputs = {"input_ids": input_ids.clone(), "doc_lens": lens, "max_doc_lens": [max(doc_lens)]}
    return AuthorsSplit(rank, size, force).get_sequence_parallel_inputs(inputs)
