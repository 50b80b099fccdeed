"""A training feature (GRPO's): VERL's dynamic micro-batching (`actor.use_dynamic_bsz`, `ppo_max_token_len_per_gpu`)
for TRL's GRPOTrainer: each process's mini-batch (the completions of one optimizer update) is cut into token-balanced
micro-batches instead of TRL's fixed `per_device_train_batch_size` slices, and each micro-batch's token-mean loss is
weighted by its share of the mini-batch's sequences, as the Instella-Math authors ran it (docs/grpo.md "Loss
aggregation").

The authors' VERL copy ([MATH] AMD-AIG-AIMA/Instella-Math 65534d3):
- `verl/verl/utils/seqlen_balancing.py` `rearrange_micro_batches`: K = ceil(sum of the sequences' lengths, prompt +
  response tokens of the attention mask / max_token_len), all-reduced with MAX over the data-parallel ranks, then
  `get_seqlen_balanced_partitions(lengths, K, equal_size=False)`: Karmarkar-Karp's largest differencing method;
- `verl/verl/workers/actor/dp_actor.py` L346-348: `loss = policy_loss * (len(micro_batch) / ppo_mini_batch_size)`,
  policy_loss being the micro-batch's token mean (loss_agg_mode token-mean, KL term included).

So a response i in micro-batch m (n_m sequences, T_m response tokens) of a process's mini-batch of B sequences enters
the loss with weight (n_m / B) / T_m per token; TRL's fixed slices (`loss_type: bnpo`) give 1 / (G T_m) with G the
gradient-accumulation steps. They agree when every micro-batch holds B / G sequences, e.g. K = G with equal counts.

Why no library does it: TRL 1.16 has no token-budget micro-batching, and the Trainer runs exactly
`gradient_accumulation_steps` forward/backward passes per update, while K varies per update (3 to 11 on simulated
long-reasoning rollouts). `DynamicMicroBatching.training_step` therefore collects TRL's G slices of one update (TRL's
own generation, buffering and slicing untouched), and at the last one runs the K micro-batches, the first K-1 without
gradient sync. The partition restates VERL's `karmarkar_karp` (Apache-2.0, copyright Bytedance Ltd.) with its heap
order and tie-breaks, VERL not being a dependency; tests/unit/post_training/test_exactness_dynamic_batching.py calls
VERL's own code (tests/helpers/verl_seqlen_balancing.py) as the oracle.
"""

import heapq
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from instella_recipes.core import RecipeError

from ..settings import RUN
from .feature import Feature


@dataclass
class DynamicBatchingSettings:
    """The two VERL actor settings, under VERL's names (a dataclass mixin of the stage's settings)."""

    use_dynamic_bsz: bool = field(
        default=False,
        metadata={
            "role": RUN,
            "help": "VERL's dynamic micro-batches: token-balanced micro-batches of at most ppo_max_token_len_per_gpu "
            "tokens, each micro-batch's token mean weighted by its share of sequences (false: TRL's fixed slices).",
        },
    )
    ppo_max_token_len_per_gpu: int | None = field(
        default=None,
        metadata={"role": RUN, "help": "Token budget (prompt + completion) of one micro-batch (VERL's name)."},
    )

    def __post_init__(self):
        if self.use_dynamic_bsz:
            check_dynamic_batching(self)
        super().__post_init__()


def check_dynamic_batching(args) -> None:
    """Settings the micro-batching needs, each failure one line naming the field."""
    budget = args.ppo_max_token_len_per_gpu
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise RecipeError(f"ppo_max_token_len_per_gpu must be a positive integer with use_dynamic_bsz, not {budget!r}")
    if args.loss_type != "bnpo":
        raise RecipeError(
            f"use_dynamic_bsz weights each micro-batch's token mean (VERL's token-mean, loss_type: bnpo); "
            f"with loss_type '{args.loss_type}' set use_dynamic_bsz: false"
        )
    longest = (args.max_prompt_length or 0) + (args.max_completion_length or 0)
    if args.max_prompt_length is None or longest > budget:
        raise RecipeError(
            f"ppo_max_token_len_per_gpu {budget} must hold the longest sequence, max_prompt_length + "
            f"max_completion_length = {longest} (VERL asserts the same): raise it or lower max_completion_length"
        )
    steps, accumulation = args.steps_per_generation, args.gradient_accumulation_steps
    if steps is not None and steps % accumulation:
        raise RecipeError(
            f"use_dynamic_bsz regroups one update's slices of one generation: steps_per_generation ({steps}) must be "
            f"a multiple of gradient_accumulation_steps ({accumulation})"
        )


# --- VERL's partition (seqlen_balancing.py), restated --------------------------------------------------------------
class _Set:
    __slots__ = ("sum", "items")

    def __init__(self):
        self.sum, self.items = 0, []

    def add(self, idx: int, val: int):
        self.items.append((idx, val))
        self.sum += val

    def merge(self, other: "_Set"):
        for idx, val in other.items:
            self.add(idx, val)

    def __lt__(self, other: "_Set") -> bool:
        if self.sum != other.sum:
            return self.sum < other.sum
        if len(self.items) != len(other.items):
            return len(self.items) < len(other.items)
        return self.items < other.items


class _State:
    __slots__ = ("k", "sets")

    def __init__(self, idx: int, seqlen: int, k: int):
        self.k, self.sets = k, [_Set() for _ in range(k)]
        self.sets[0].add(idx, seqlen)
        self.sets.sort(reverse=True)

    def merge(self, other: "_State"):
        for i in range(self.k):
            self.sets[i].merge(other.sets[self.k - 1 - i])
        self.sets.sort(reverse=True)

    @property
    def spread(self) -> int:
        return self.sets[0].sum - self.sets[-1].sum

    def __lt__(self, other: "_State") -> bool:  # a min-heap that pops the largest spread first
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.sets[0] > other.sets[0]


def balanced_partitions(seqlens: list[int], k: int) -> list[list[int]]:
    """VERL's `get_seqlen_balanced_partitions(seqlens, k, equal_size=False)`: Karmarkar-Karp (largest differencing)
    into k non-empty groups of indices, each sorted; the same heap order and tie-breaks as VERL's, hence the same
    groups (the oracle test compares them)."""
    if not 1 <= k <= len(seqlens):
        raise ValueError(f"cannot cut {len(seqlens)} sequences into {k} non-empty micro-batches")
    heap = []
    for seqlen, idx in sorted((seqlen, i) for i, seqlen in enumerate(seqlens)):
        heapq.heappush(heap, _State(idx, seqlen, k))
    while len(heap) > 1:
        first, second = heapq.heappop(heap), heapq.heappop(heap)
        first.merge(second)
        heapq.heappush(heap, first)
    partitions = [sorted(idx for idx, _ in s.items) for s in heap[0].sets]
    if any(not p for p in partitions):
        raise ValueError("an empty micro-batch")  # VERL asserts the same
    return partitions


def micro_batch_count(total_tokens: int, max_token_len: int, device=None) -> int:
    """ceil(total_tokens / max_token_len), the MAX over all processes when torch.distributed is initialized (every
    process then runs the same number of forward/backward passes, so their collectives pair up)."""
    count = -(total_tokens // -max_token_len)
    if dist.is_available() and dist.is_initialized():
        tensor = torch.tensor([count], device=device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        count = int(tensor.item())
    return count


def plan_micro_batches(seqlens: list[int], max_token_len: int, device=None) -> list[list[int]]:
    """The mini-batch's rows grouped into micro-batches as VERL's `rearrange_micro_batches` groups them."""
    return balanced_partitions(seqlens, micro_batch_count(sum(seqlens), max_token_len, device))


# --- TRL's batches -------------------------------------------------------------------------------------------------
def sequence_lengths(batch: dict) -> list[int]:
    """Prompt + completion tokens of each row (VERL counts the attention mask: both parts)."""
    return (batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)).tolist()


def concat_rows(chunks: list[dict]) -> dict:
    """TRL's slices of one generation batch (`split_tensor_dict`: same keys, same padded widths) joined again."""
    joined = {}
    for key, value in chunks[0].items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            joined[key] = torch.cat([c[key] for c in chunks])
        elif isinstance(value, list):
            joined[key] = [item for c in chunks for item in c[key]]
        else:  # scalars (num_items_in_batch) and None are the same in every slice
            joined[key] = value
    return joined


def take_rows(batch: dict, rows: list[int]) -> dict:
    """The rows of `batch` (as `split_tensor_dict` slices it), with the padding columns no row in them uses cut:
    prompts are left-padded and completions right-padded, so a micro-batch of short sequences is not padded to the
    longest of the mini-batch (VERL removes all padding)."""
    index = torch.tensor(rows, device=batch["completion_mask"].device)
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.ndim > 0:
            out[key] = value.index_select(0, index)
        elif isinstance(value, list):
            out[key] = [value[i] for i in rows]
        else:
            out[key] = value
    prompt_width = int(out["prompt_mask"].sum(1).max())
    completion_width = max(int(out["completion_mask"].sum(1).max()), 1)
    full_prompt, full_completion = batch["prompt_mask"].size(1), batch["completion_mask"].size(1)
    for key, value in out.items():
        if not isinstance(value, torch.Tensor) or value.ndim < 2:
            continue
        if key.startswith("prompt") and value.size(1) == full_prompt:
            out[key] = value[:, full_prompt - prompt_width :]
        elif not key.startswith("prompt") and value.size(1) == full_completion:
            out[key] = value[:, :completion_width]
    return out


class DynamicMicroBatching:
    """A GRPOTrainer mixin (before GRPOTrainer in the bases): with `args.use_dynamic_bsz`, each process's optimizer
    update runs VERL's token-balanced micro-batches, each micro-batch's loss (TRL's `compute_loss`: token mean / G for
    `bnpo`) scaled by G n_m / B, i.e. VERL's n_m / B times the token mean. Without it, TRL's fixed slices."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not getattr(self.args, "use_dynamic_bsz", False):
            return super().training_step(model, inputs, num_items_in_batch)
        started = time.perf_counter()
        model.train()  # before TRL's _prepare_inputs, which reads the mode (as Trainer.training_step orders them)
        optimizer = getattr(self, "optimizer", None)
        if callable(getattr(optimizer, "train", None)):  # schedule-free optimizers, as Trainer.training_step
            optimizer.train()
        # private: TRL's generation buffer, sliced per accumulation step by its step counter [test_private_apis]
        chunk = self._prepare_inputs(inputs)
        self._step += 1
        pending = getattr(self, "_dynamic_pending", None) or []
        pending.append(chunk)
        self._dynamic_pending = pending
        accumulation = self.current_gradient_accumulation_steps
        if len(pending) < accumulation:
            loss = torch.zeros((), device=self.accelerator.device)  # the update runs with the last slice
        else:
            self._dynamic_pending = []
            loss = self._dynamic_update(model, concat_rows(pending), accumulation)
        self._record_step_time(time.perf_counter() - started)
        return loss

    def _dynamic_update(self, model, mini_batch: dict, accumulation: int) -> torch.Tensor:
        """Forward and backward of every micro-batch of one update; returns the update's loss (VERL's value)."""
        rows = mini_batch["completion_mask"].size(0)
        plan = plan_micro_batches(
            sequence_lengths(mini_batch), self.args.ppo_max_token_len_per_gpu, self.accelerator.device
        )
        self._metrics["train"]["micro_batches"].append(float(len(plan)))
        total = torch.zeros((), device=self.accelerator.device)
        for number, group in enumerate(plan):
            last = number == len(plan) - 1
            # one gradient reduction per update, as the Trainer's own accumulation does
            sync = nullcontext() if last else self.accelerator.no_sync(model)
            with sync:
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(model, take_rows(mini_batch, group))
                loss = loss * (accumulation * len(group) / rows)  # TRL's / G undone, VERL's n_m / B applied
                self.accelerator.backward(loss)
            total = total + loss.detach()
        return total

    def _record_step_time(self, seconds: float) -> None:
        """TRL's `step_time` metric, as its own training_step keeps it."""
        self._current_train_step_time += seconds
        if self._step % self.current_gradient_accumulation_steps == 0:
            self._metrics["train"]["step_time"].append(self._current_train_step_time)
            self._current_train_step_time = 0.0


# GRPO's (the only stage whose micro-batches are responses of varied length); its mixin reads `self.args`
FEATURE = Feature(name="dynamic_micro_batches", settings=DynamicBatchingSettings, trainer_mixin=DynamicMicroBatching)
