"""VERL's dynamic micro-batching (`use_dynamic_bsz`, `ppo_max_token_len_per_gpu: 17000`, the authors' stages 2-3) in
our GRPO trainer equals the authors' VERL: every response's weight in the loss, on mini-batches of 16 rollouts per
process whose lengths spread as long reasoning does (median about 5,000 tokens, 50 to 16,000), to 1e-6 relative, on
1 process and on 2 gloo processes (where VERL's MAX over ranks of the micro-batch count matters).

VERL's side is their code: `rearrange_micro_batches` (tests/helpers/verl_seqlen_balancing.py, copied test-only from
AMD-AIG-AIMA/Instella-Math at 65534d3) and the actor's token-mean x len(micro_batch) / ppo_mini_batch_size. Ours is
`DynamicMicroBatching.training_step` itself, called once per accumulation slice as the Trainer calls it, on TRL's
batch layout (left-padded prompts, right-padded completions); only the loss is replaced, on both sides, by a probe
that gives every token of response i the value x_i, so d loss / d x_i / (tokens of i) is the response's weight."""

import socket
from collections import defaultdict
from contextlib import nullcontext
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from instella_recipes.core import RecipeError
from instella_recipes.post_training.dynamic_batching import DynamicMicroBatching, balanced_partitions
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


def test_partition_equals_verl_karmarkar_karp():
    gen = torch.Generator().manual_seed(1)
    for trial in range(200):
        lengths = torch.randint(1, 50 if trial % 2 else 20000, (int(torch.randint(1, 40, (1,), generator=gen)),))
        lengths = lengths.tolist()
        k = int(torch.randint(1, len(lengths) + 1, (1,), generator=gen))
        assert balanced_partitions(lengths, k) == verl.get_seqlen_balanced_partitions(lengths, k, equal_size=False)


def test_response_weights_equal_verl_on_one_process():
    results = [compare(rollouts(seed)) for seed in range(40)]
    assert max(r["relative"] for r in results) < 1e-6
    counts = sorted(r["count"] for r in results)
    assert counts[len(counts) // 2] > ACCUMULATION  # 5 to 10 micro-batches (median 6-7) instead of TRL's 4 slices
    assert all(r["ours_count"] == r["count"] for r in results)
    # the fixed slices are not VERL's on such batches (typically tens of percent for some response)
    assert sorted(r["fixed_relative"] for r in results)[len(results) // 2] > 0.2
    assert max(r["widest"] for r in results) < PROMPT + RESPONSE  # padding no row of the micro-batch uses is cut


def test_fixed_slices_agree_when_the_micro_batches_are_equal():
    """docs/grpo.md: the two agree when VERL forms G micro-batches of B / G sequences each, e.g. equal lengths with
    ceil(B x length / budget) = G."""
    batch = rollouts(0)
    batch["prompt_mask"][:] = (torch.arange(PROMPT) >= PROMPT - 300).long()
    batch["completion_mask"][:] = (torch.arange(RESPONSE) < 3700).long()
    result = compare(batch)
    assert result["count"] == ACCUMULATION and result["relative"] < 1e-6 and result["fixed_relative"] < 1e-6


def _worker(rank: int, port: int, queue) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        # rank 1's rollouts are 3x shorter: its own count is smaller than rank 0's, VERL takes the MAX on both
        results = [compare(rollouts(100 * rank + seed, scale=1.0 if rank == 0 else 0.33)) for seed in range(6)]
        local = [-(sum(verl_inputs_lengths(rollouts(100 * rank + s, 1.0 if rank == 0 else 0.33))) // -BUDGET)
                 for s in range(6)]  # fmt: skip
        queue.put((rank, results, local))
    finally:
        dist.destroy_process_group()


def verl_inputs_lengths(batch: dict) -> list[int]:
    return (batch["prompt_mask"].sum(1) + batch["completion_mask"].sum(1)).tolist()


def test_response_weights_equal_verl_on_two_gloo_processes():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    mp.start_processes(_worker, args=(port, queue), nprocs=2, start_method="spawn", join=True)
    by_rank = dict((rank, (results, local)) for rank, results, local in (queue.get(), queue.get()))
    for rank in (0, 1):
        results, _ = by_rank[rank]
        assert max(r["relative"] for r in results) < 1e-6
    for step in range(6):
        counts = {by_rank[rank][0][step]["count"] for rank in (0, 1)}
        local = [by_rank[rank][1][step] for rank in (0, 1)]
        assert counts == {max(local)} and by_rank[0][0][step]["ours_count"] == max(local)
    assert any(by_rank[1][1][step] < by_rank[0][1][step] for step in range(6))  # the MAX changed rank 1's cut


def test_settings_checked_before_any_work():
    from instella_recipes.post_training.grpo import CheckedGRPOConfig

    base = dict(
        output_dir="/tmp/unused",
        use_dynamic_bsz=True,
        report_to="none",
        use_bias_correction_kl=False,
        loss_type="bnpo",
        beta=0.001,
        bf16=False,
    )
    with pytest.raises(RecipeError, match="ppo_max_token_len_per_gpu must be a positive integer"):
        CheckedGRPOConfig(**base)
    with pytest.raises(RecipeError, match="must hold the longest sequence"):
        CheckedGRPOConfig(**base, ppo_max_token_len_per_gpu=1000, max_completion_length=1000)
    with pytest.raises(RecipeError, match="loss_type 'grpo'"):
        CheckedGRPOConfig(**{**base, "loss_type": "grpo", "kl_clamp": None}, ppo_max_token_len_per_gpu=17000)
    config = CheckedGRPOConfig(**base, ppo_max_token_len_per_gpu=17000, max_completion_length=16000)
    assert config.use_dynamic_bsz and config.ppo_max_token_len_per_gpu == 17000
