"""VERL's dynamic micro-batching (`use_dynamic_bsz`, `ppo_max_token_len_per_gpu: 17000`, the authors' stages 2-3) in
our GRPO trainer equals the authors' VERL: every response's weight in the loss, on mini-batches of 16 rollouts per
process whose lengths spread as long reasoning does (median about 5,000 tokens, 50 to 16,000), to 1e-6 relative, on
1 process (2 gloo processes, where VERL's MAX over ranks of the micro-batch count matters:
tests/e2e/test_dynamic_batching_gloo.py), and the whole loss's gradients through the real trainer.

VERL's side is their code: `rearrange_micro_batches` (tests/helpers/verl_seqlen_balancing.py, copied test-only from
AMD-AIG-AIMA/Instella-Math at 65534d3) and the actor's token-mean x len(micro_batch) / ppo_mini_batch_size. Ours is
`DynamicMicroBatching.training_step` itself, called once per accumulation slice as the Trainer calls it, on TRL's
batch layout (left-padded prompts, right-padded completions); only the loss is replaced, on both sides, by a probe
that gives every token of response i the value x_i, so d loss / d x_i / (tokens of i) is the response's weight
(tests/helpers/dynamic_batching_probe.py)."""

import copy

import pytest
import torch

from instella_recipes.core import RecipeError
from instella_recipes.trainer.features.dynamic_batching import balanced_partitions
from tests.helpers import verl_core_algos as verl_core
from tests.helpers import verl_seqlen_balancing as verl
from tests.helpers.dynamic_batching_probe import ACCUMULATION, PROMPT, RESPONSE, compare, rollouts


def test_partition_equals_verl_karmarkar_karp():
    gen = torch.Generator().manual_seed(1)
    for trial in range(200):
        lengths = torch.randint(1, 50 if trial % 2 else 20000, (int(torch.randint(1, 40, (1,), generator=gen)),))
        lengths = lengths.tolist()
        k = int(torch.randint(1, len(lengths) + 1, (1,), generator=gen))
        assert balanced_partitions(lengths, k) == verl.get_seqlen_balanced_partitions(lengths, k, equal_size=False)


def test_response_weights_equal_verl_on_one_process():
    results = [compare(rollouts(seed)) for seed in range(8)]
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


# --- the whole loss, through the real trainer ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def chat_tokenizer(tiny_tokenizer):
    from instella_recipes.post_training.template import install_chat_template

    return install_chat_template(copy.deepcopy(tiny_tokenizer))


def uneven_batch(vocab: int, rows: int = 8, prompt: int = 5, completion: int = 6):
    """TRL's layout with prompts of 1-5 and completions of 1-6 tokens, ratios and KLs past the clip and clamp edges."""
    gen = torch.Generator().manual_seed(3)
    prompt_len = torch.randint(1, prompt + 1, (rows,), generator=gen)
    completion_len = torch.randint(1, completion + 1, (rows,), generator=gen)
    return {
        "prompt_ids": torch.randint(2, vocab, (rows, prompt), generator=gen),
        "prompt_mask": (torch.arange(prompt) >= prompt - prompt_len.unsqueeze(1)).long(),
        "completion_ids": torch.randint(2, vocab, (rows, completion), generator=gen),
        "completion_mask": (torch.arange(completion) < completion_len.unsqueeze(1)).long(),
        "advantages": torch.randn(rows, generator=gen),
        "old_shift": torch.randn(rows, completion, generator=gen),
        "ref_shift": torch.randn(rows, completion, generator=gen) * 4,
    }


def trainer_gradients(trainer, batch: dict, old, ref) -> list[torch.Tensor]:
    """One update through `trainer.training_step`, called once per slice as the Trainer calls it (TRL's buffered
    slices stand in: the generation itself is tested elsewhere)."""
    from tests.unit.post_training.test_exactness_grpo import grads

    inputs = {k: v for k, v in batch.items() if not k.endswith("_shift")}
    inputs.update(old_per_token_logps=old, ref_per_token_logps=ref, num_items_in_batch=batch["completion_mask"].sum())
    half = len(inputs["advantages"]) // 2
    slices = [{k: v if v.ndim == 0 else v[i : i + half] for k, v in inputs.items()} for i in (0, half)]
    trainer._prepare_inputs = lambda _: slices[trainer._step % 2]
    trainer.current_gradient_accumulation_steps = 2
    for _ in range(2):
        trainer.training_step(trainer.model, None)
    return grads(trainer.model)


def test_whole_loss_gradients_equal_verl_dynamic_batches(tmp_path, chat_tokenizer, tiny_model_dir, one_thread):
    """The real InstellaGRPOTrainer (TRL's loss, our KL clamp, the tiny model) on an update of 8 uneven rollouts
    (2 slices of 4), 20-token budget: its gradients equal VERL's actor with use_dynamic_bsz (their partition, their
    loss per micro-batch x len / mini-batch) to 1e-6 (measured 1.5e-7: 3 micro-batches of 3, 2 and 3 rollouts); TRL's
    fixed slices do not (0.12 off, the largest gradient entry being 0.4)."""
    from tests.unit.post_training.test_exactness_grpo import grads, make_trainer, verl_logps

    settings = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_generations=4,
                    max_prompt_length=10, ppo_max_token_len_per_gpu=20)  # fmt: skip
    trainer = make_trainer(tmp_path, chat_tokenizer, tiny_model_dir, use_dynamic_bsz=True, **settings)
    model = trainer.model
    model.train()
    batch = uneven_batch(model.config.vocab_size)
    input_ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention_mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logp0 = verl_logps(model, input_ids, attention_mask, batch["completion_ids"])
    old, ref = logp0 - batch["old_shift"], logp0 + batch["ref_shift"]
    ours = trainer_gradients(trainer, batch, old, ref)
    count = trainer._metrics["train"]["micro_batches"][-1]

    rows = verl.Rows({"input_ids": input_ids, "attention_mask": attention_mask, "responses": batch["completion_ids"],
                      "old": old, "ref": ref, "mask": batch["completion_mask"].float(),
                      "advantages": batch["advantages"].unsqueeze(1).expand_as(old)})  # fmt: skip
    micro_batches, partitions = verl.rearrange_micro_batches(batch=rows, max_token_len=20)
    for data in micro_batches:
        log_prob = verl_logps(model, data["input_ids"], data["attention_mask"], data["responses"])
        loss, _, _ = verl_core.verl_actor_micro_batch_loss(
            data["old"], log_prob, data["ref"], data["advantages"], data["mask"], 8 / len(data)
        )  # gradient_accumulation = B / n_m: their dynamic line, loss * len(micro_batch) / ppo_mini_batch_size
        loss.backward()
    theirs = grads(model)
    assert count == len(partitions) > 2 and len({len(p) for p in partitions}) > 1, partitions
    assert len(ours) == len(theirs) > 0
    assert max((a - b).abs().max().item() for a, b in zip(ours, theirs)) < 1e-6

    fixed = make_trainer(tmp_path / "fixed", chat_tokenizer, tiny_model_dir, use_dynamic_bsz=False, **settings)
    fixed_grads = trainer_gradients(fixed, batch, old, ref)
    assert max((a - b).abs().max().item() for a, b in zip(fixed_grads, theirs)) > 1e-5
