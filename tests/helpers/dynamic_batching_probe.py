"""Test-only probe of GRPO's dynamic micro-batching (trainer/features/dynamic_batching.py) against VERL's
(tests/helpers/verl_seqlen_balancing.py): rollouts in TRL's layout with long-reasoning lengths, the mixin on a stand-in
for what it uses of GRPOTrainer, and each response's weight in the loss on both sides, read off as the gradient of a
per-response probe (every token of response i has loss x_i: d loss / d x_i / tokens of i is the response's weight).
Used by tests/unit/post_training/test_exactness_dynamic_batching.py (1 process) and
tests/e2e/test_dynamic_batching_gloo.py (2 gloo processes, `gloo_worker`)."""

from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace

import torch
import torch.distributed as dist

from instella_recipes.trainer.features.dynamic_batching import DynamicMicroBatching
from tests.helpers import verl_seqlen_balancing as verl

BUDGET, PROMPT, RESPONSE = 17000, 512, 16000  # run_grpo_multi_nodes.sh L118-119, L127
MINI_BATCH, ACCUMULATION = 16, 4  # per GPU: 32 prompts x 16 rollouts / 32 GPUs; ours 4 x 4


def rollouts(seed: int, scale: float = 1.0) -> dict:
    """One process's mini-batch in TRL's layout: lognormal response lengths (median 5,000 x scale, sigma 0.8,
    clipped to [50, 16000]), prompts of 40-512 tokens."""
    gen = torch.Generator().manual_seed(seed)
    response = (torch.randn(MINI_BATCH, generator=gen) * 0.8).exp() * 5000 * scale
    response = response.round().long().clamp(50, RESPONSE)
    prompt = torch.randint(40, PROMPT + 1, (MINI_BATCH,), generator=gen)
    columns = torch.arange(PROMPT)
    return {
        "prompt_mask": (columns >= PROMPT - prompt.unsqueeze(1)).long(),  # left-padded
        "completion_mask": (torch.arange(RESPONSE) < response.unsqueeze(1)).long(),  # right-padded
        "advantages": torch.randn(MINI_BATCH, generator=gen),
        "row": torch.arange(MINI_BATCH),
        "num_items_in_batch": torch.tensor(float(response.sum())),
    }


class ProbeTrainer(DynamicMicroBatching):
    """The mixin on what it uses of GRPOTrainer: TRL's slices of the mini-batch, one per accumulation step, and a
    loss with TRL's bnpo contract (token mean of the micro-batch / gradient-accumulation steps)."""

    def __init__(self, batch: dict):
        self.args = SimpleNamespace(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=BUDGET)
        self.accelerator = SimpleNamespace(
            device=torch.device("cpu"), no_sync=lambda model: nullcontext(), backward=lambda loss: loss.backward()
        )
        self.current_gradient_accumulation_steps = ACCUMULATION
        self._step, self._current_train_step_time, self._metrics = 0, 0.0, {"train": defaultdict(list)}
        size = MINI_BATCH // ACCUMULATION
        self.slices = [
            {k: v if v.ndim == 0 else v[i : i + size] for k, v in batch.items()} for i in range(0, MINI_BATCH, size)
        ]
        self.probe = torch.zeros(MINI_BATCH, dtype=torch.float64, requires_grad=True)
        self.widths = []

    def _prepare_inputs(self, inputs):
        return self.slices[self._step % ACCUMULATION]

    def compute_loss_context_manager(self):
        return nullcontext()

    def compute_loss(self, model, inputs):
        mask = inputs["completion_mask"].to(torch.float64)
        self.widths.append(inputs["prompt_mask"].size(1) + mask.size(1))
        token_mean = (self.probe[inputs["row"]].unsqueeze(1) * mask).sum() / mask.sum()
        return token_mean / self.current_gradient_accumulation_steps


def our_weights(batch: dict) -> tuple[torch.Tensor, ProbeTrainer]:
    trainer = ProbeTrainer(batch)
    losses = [trainer.training_step(torch.nn.Module(), None) for _ in range(ACCUMULATION)]
    assert [float(x) for x in losses[:-1]] == [0.0] * (ACCUMULATION - 1)  # the update runs with the last slice
    return trainer.probe.grad / batch["completion_mask"].sum(1), trainer


def verl_weights(batch: dict) -> tuple[torch.Tensor, list[list[int]]]:
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    return verl.verl_response_weights(attention_mask, batch["completion_mask"], MINI_BATCH, BUDGET)


def fixed_weights(batch: dict) -> torch.Tensor:
    """TRL's fixed slices (`loss_type: bnpo`): 1 / (G x the slice's tokens)."""
    tokens = batch["completion_mask"].sum(1).view(ACCUMULATION, -1).sum(1, keepdim=True).to(torch.float64)
    return (1.0 / (ACCUMULATION * tokens)).expand(ACCUMULATION, MINI_BATCH // ACCUMULATION).reshape(-1)


def compare(batch: dict) -> dict:
    ours, trainer = our_weights(batch)
    theirs, partitions = verl_weights(batch)
    return {
        "relative": ((ours - theirs).abs() / theirs).max().item(),
        "fixed_relative": ((fixed_weights(batch) - theirs).abs() / theirs).max().item(),
        "count": len(partitions),
        "ours_count": int(trainer._metrics["train"]["micro_batches"][0]),
        "widest": max(trainer.widths),
    }


def gloo_worker(rank: int, port: int, queue) -> None:
    """One of 2 gloo ranks: both sides on 4 mini-batches of this rank; puts (rank, comparisons, own counts)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # rank 1's rollouts are 3x shorter: its own count is smaller than rank 0's, VERL takes the MAX on both
        results = [compare(rollouts(100 * rank + seed, scale=1.0 if rank == 0 else 0.33)) for seed in range(4)]
        local = [-(sum(verl_inputs_lengths(rollouts(100 * rank + s, 1.0 if rank == 0 else 0.33))) // -BUDGET)
                 for s in range(4)]  # fmt: skip
        queue.put((rank, results, local))
    finally:
        dist.destroy_process_group()


def verl_inputs_lengths(batch: dict) -> list[int]:
    return (batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)).tolist()
