# ruff: noqa
"""TEST-ONLY oracle: VERL's dynamic micro-batch partition exactly as the Instella-Math authors ran it, copied verbatim
(then `ruff format`ted: layout only).

Source: github.com/AMD-AIG-AIMA/Instella-Math at commit 65534d33d47a4d1d97b6e73b35bdf169968a851c,
`verl/verl/utils/seqlen_balancing.py` L24-123 `karmarkar_karp`, L144-175 `get_seqlen_balanced_partitions`,
L212-247 `ceildiv`, `rearrange_micro_batches` (`greedy_partition`, `log_seqlen_unbalance`, `get_reverse_idx` cut:
unused by the actor). The per-micro-batch weighting it feeds is `verl/verl/workers/actor/dp_actor.py` L276-278 and
L346-348, restated in `verl_response_weights` below.
The only edits: `from tensordict import TensorDict` -> `Rows` below (tensordict is not installed here; `Rows` does
the two things the function asks of a TensorDict: a column by name, rows by slice, and `torch.cat`); the MAX
all-reduce's tensor on `device="cpu"` instead of `"cuda"` (the tests run gloo). Never imported by the library
(tests/unit/repo/test_layering.py). Apache-2.0, copyright Bytedance Ltd. (the upstream header follows).
"""
# Copyright 2024 Bytedance Ltd. and/or its affiliates
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.

import copy
import heapq
from typing import List, Tuple

import torch
from torch import distributed as dist


class Rows:
    """Stand-in for the TensorDict `rearrange_micro_batches` receives (not VERL code)."""

    def __init__(self, columns):
        self.columns = columns

    def __getitem__(self, key):
        if isinstance(key, str):
            return self.columns[key]
        return Rows({name: value[key] for name, value in self.columns.items()})

    def __len__(self):
        return len(next(iter(self.columns.values())))

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        assert func is torch.cat
        parts = args[0]
        return Rows({name: torch.cat([p.columns[name] for p in parts]) for name in parts[0].columns})


TensorDict = Rows


def karmarkar_karp(seqlen_list: List[int], k_partitions: int, equal_size: bool):
    # see: https://en.wikipedia.org/wiki/Largest_differencing_method
    class Set:
        def __init__(self) -> None:
            self.sum = 0
            self.items = []

        def add(self, idx: int, val: int):
            self.items.append((idx, val))
            self.sum += val

        def merge(self, other):
            for idx, val in other.items:
                self.items.append((idx, val))
                self.sum += val

        def __lt__(self, other):
            if self.sum != other.sum:
                return self.sum < other.sum
            if len(self.items) != len(other.items):
                return len(self.items) < len(other.items)
            return self.items < other.items

    class State:
        def __init__(self, items: List[Tuple[int, int]], k: int) -> None:
            self.k = k
            # sets should always be decreasing order
            self.sets = [Set() for _ in range(k)]
            assert len(items) in [1, k], f"{len(items)} not in [1, {k}]"
            for i, (idx, seqlen) in enumerate(items):
                self.sets[i].add(idx=idx, val=seqlen)
            self.sets = sorted(self.sets, reverse=True)

        def get_partitions(self):
            partitions = []
            for i in range(len(self.sets)):
                cur_partition = []
                for idx, _ in self.sets[i].items:
                    cur_partition.append(idx)
                partitions.append(cur_partition)
            return partitions

        def merge(self, other):
            for i in range(self.k):
                self.sets[i].merge(other.sets[self.k - 1 - i])
            self.sets = sorted(self.sets, reverse=True)

        @property
        def spread(self) -> int:
            return self.sets[0].sum - self.sets[-1].sum

        def __lt__(self, other):
            # least heap, let the state with largest spread to be popped first,
            # if the spread is the same, let the state who has the largest set
            # to be popped first.
            if self.spread != other.spread:
                return self.spread > other.spread
            return self.sets[0] > other.sets[0]

        def __repr__(self) -> str:
            repr_str = "["
            for i in range(self.k):
                if i > 0:
                    repr_str += ","
                repr_str += "{"
                for j, (_, seqlen) in enumerate(self.sets[i].items):
                    if j > 0:
                        repr_str += ","
                    repr_str += str(seqlen)
                repr_str += "}"
            repr_str += "]"
            return repr_str

    sorted_seqlen_list = sorted([(seqlen, i) for i, seqlen in enumerate(seqlen_list)])
    states_pq = []
    if equal_size:
        assert len(seqlen_list) % k_partitions == 0, f"{len(seqlen_list)} % {k_partitions} != 0"
        for offset in range(0, len(sorted_seqlen_list), k_partitions):
            items = []
            for i in range(k_partitions):
                seqlen, idx = sorted_seqlen_list[offset + i]
                items.append((idx, seqlen))
            heapq.heappush(states_pq, State(items=items, k=k_partitions))
    else:
        for seqlen, idx in sorted_seqlen_list:
            heapq.heappush(states_pq, State(items=[(idx, seqlen)], k=k_partitions))

    while len(states_pq) > 1:
        state0 = heapq.heappop(states_pq)
        state1 = heapq.heappop(states_pq)
        # merge states
        state0.merge(state1)
        heapq.heappush(states_pq, state0)

    final_state = states_pq[0]
    partitions = final_state.get_partitions()
    if equal_size:
        for i, partition in enumerate(partitions):
            assert len(partition) * k_partitions == len(seqlen_list), (
                f"{len(partition)} * {k_partitions} != {len(seqlen_list)}"
            )
    return partitions


def get_seqlen_balanced_partitions(seqlen_list: List[int], k_partitions: int, equal_size: bool):
    """get order of seq lengths to make partitions balanced, this is
        used in balacing sum of seqlength across dp ranks and microbatches
    Parameters:
        seqlen_list (List[int]):
            seq lengths of each items
        k_partitions (int):
            resulting number of partitions
        equal_size (bool):
            if True, number of items in each partitions must be equal.
            if False, only consider balancing the sum, each partition can have
            variable number of items
    Returns:
        partitions (List[List[int]]):
            return k_partitions list containing the index of items.
    """
    assert len(seqlen_list) >= k_partitions, f"number of items:[{len(seqlen_list)}] < k_partitions:[{k_partitions}]"

    def _check_and_sort_partitions(partitions):
        assert len(partitions) == k_partitions, f"{len(partitions)} != {k_partitions}"
        seen_idx = set()
        sorted_partitions = [None] * k_partitions
        for i, partition in enumerate(partitions):
            assert len(partition) > 0, f"the {i}-th partition is empty"
            for idx in partition:
                seen_idx.add(idx)
            sorted_partitions[i] = sorted(partition)
        assert seen_idx == set(range(len(seqlen_list)))
        return sorted_partitions

    partitions = karmarkar_karp(seqlen_list=seqlen_list, k_partitions=k_partitions, equal_size=equal_size)
    return _check_and_sort_partitions(partitions)


def ceildiv(a, b):
    return -(a // -b)


def rearrange_micro_batches(batch: TensorDict, max_token_len, dp_group=None):
    """Split the batch into a list of micro_batches, where the max_token_len is smaller than max_token_len
    and the number of valid tokens in each micro batch is well balanced.
    """
    # this is per local micro_bsz
    max_seq_len = batch["attention_mask"].shape[-1]
    assert max_token_len >= max_seq_len, (
        f"max_token_len must be greater than the sequence length. Got {max_token_len=} and {max_seq_len=}"
    )

    seq_len_effective: torch.Tensor = batch["attention_mask"].sum(dim=1)
    total_seqlen = seq_len_effective.sum().item()
    num_micro_batches = ceildiv(total_seqlen, max_token_len)
    if dist.is_initialized():
        num_micro_batches = torch.tensor([num_micro_batches], device="cpu")
        dist.all_reduce(num_micro_batches, op=dist.ReduceOp.MAX, group=dp_group)
        num_micro_batches = num_micro_batches.cpu().item()

    seq_len_effective = seq_len_effective.tolist()
    assert num_micro_batches <= len(seq_len_effective)

    micro_bsz_idx = get_seqlen_balanced_partitions(seq_len_effective, num_micro_batches, equal_size=False)

    micro_batches = []

    for partition in micro_bsz_idx:
        curr_micro_batch = []
        for idx in partition:
            curr_micro_batch.append(batch[idx : idx + 1])
        curr_micro_batch = torch.cat(curr_micro_batch)

        micro_batches.append(curr_micro_batch)

    return micro_batches, micro_bsz_idx


def verl_response_weights(attention_mask, response_mask, ppo_mini_batch_size, max_token_len):
    """Each response's weight per token in one GPU's mini-batch loss, as dp_actor.py's update_policy forms it with
    use_dynamic_bsz (restated, not copied): the mini-batch cut by `rearrange_micro_batches`, each micro-batch's loss the
    token mean (`agg_loss(..., "token-mean")`, core_algos.py) scaled by `len(micro_batch) / ppo_mini_batch_size`.
    Read off as the gradient of the loss of a per-response probe (every token of response i has loss x_i): d loss /
    d x_i = weight_i * (response i's tokens). Returns (weights, partitions)."""
    from tests.helpers.verl_core_algos import agg_loss

    rows = attention_mask.size(0)
    probe = torch.zeros(rows, dtype=torch.float64, requires_grad=True)
    batch = Rows({"attention_mask": attention_mask, "response_mask": response_mask, "row": torch.arange(rows)})
    micro_batches, partitions = rearrange_micro_batches(batch=batch, max_token_len=max_token_len)
    for data in micro_batches:
        mask = data["response_mask"].to(torch.float64)
        policy_loss = agg_loss(
            loss_mat=probe[data["row"]].unsqueeze(1) * mask, loss_mask=mask, loss_agg_mode="token-mean"
        )
        loss = policy_loss * (len(data) / ppo_mini_batch_size)
        loss.backward()
    tokens = response_mask.sum(1).to(torch.float64)
    return probe.grad / tokens, partitions
