"""The GRPO objective equals the authors' VERL objective on a fixed batch, to 1e-6: the same per-token log-probs, GRPO
advantages, clipped policy loss (clip 0.2 both sides, dual-clip c = 3), clamped k3 KL (coefficient 0.001) and
token-mean aggregation, and the same gradients. VERL's side is their code (tests/helpers/verl_core_algos.py, copied
test-only from AMD-AIG-AIMA/Instella-Math at 65534d3); ours is `InstellaGRPOTrainer` run through TRL's own loss."""

import copy

import pytest
import torch
from datasets import Dataset

from instella_recipes.post_training.grpo import CheckedGRPOConfig, InstellaGRPOTrainer, grpo_advantages
from instella_recipes.post_training.template import install_chat_template
from modeling_instella import InstellaForCausalLM
from tests.helpers import verl_core_algos as verl

GROUP = 4
PROMPT, COMPLETION = 5, 6
SCORES = []  # what the recorded reward function returned, in call order


def recorded_reward(completions, ground_truth, **kwargs):
    """Deterministic, uneven rewards (length-based) so that every group has a non-zero std."""
    values = [float(len(c) % 3) + 0.5 * (i % 2) for i, c in enumerate(completions)]
    SCORES.extend(values)
    return values


def make_trainer(tmp_path, tokenizer, model_dir, **overrides) -> InstellaGRPOTrainer:
    settings = dict(
        output_dir=str(tmp_path), per_device_train_batch_size=GROUP, num_generations=GROUP,
        max_completion_length=COMPLETION, beta=0.001, epsilon=0.2, epsilon_high=0.2, delta=3.0, loss_type="bnpo",
        temperature=1.0, use_bias_correction_kl=False, use_cpu=True, bf16=False, report_to="none",
        activation_checkpointing=False,
        reward_funcs=["tests.unit.post_training.test_exactness_grpo.recorded_reward"], seed=0,
    )  # fmt: skip
    settings.update(overrides)
    args = CheckedGRPOConfig(**settings)
    model = InstellaForCausalLM.from_pretrained(model_dir)  # from a folder: TRL loads the reference model from it
    data = Dataset.from_list([{"prompt": [{"role": "user", "content": "1 + 1 ="}], "ground_truth": "2"}] * GROUP)
    return InstellaGRPOTrainer(
        model=model, reward_funcs=[recorded_reward], args=args, train_dataset=data, processing_class=tokenizer,
        advantage_epsilon=args.advantage_epsilon, kl_clamp=args.kl_clamp,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return install_chat_template(copy.deepcopy(tiny_tokenizer))


def fixed_batch(vocab: int):
    """Prompts left-padded, completions right-padded (as TRL builds them), and the ratios/KLs that exercise every
    branch: r > 1.2 and r < 0.8 for both signs of A, r > 3 with A < 0 (dual clip), |ref - logp| past the clamp."""
    g = torch.Generator().manual_seed(1)
    prompt_ids = torch.randint(2, vocab, (GROUP, PROMPT), generator=g)
    prompt_mask = torch.ones(GROUP, PROMPT, dtype=torch.long)
    prompt_mask[1, :2] = 0
    completion_ids = torch.randint(2, vocab, (GROUP, COMPLETION), generator=g)
    completion_mask = torch.ones(GROUP, COMPLETION, dtype=torch.long)
    completion_mask[2, 4:] = 0
    completion_mask[3, 1:] = 0
    old_shift = torch.tensor(
        [[0.0, 0.5, -0.5, 1.5, -1.5, 0.1], [1.6, -1.6, 0.3, -0.3, 0.0, 2.0], [-2.0, 1.2, 0.05, -0.05, 0, 0],
         [0.7, 0, 0, 0, 0, 0]]
    )  # fmt: skip  # logp - old_logp: ratio = exp(shift)
    ref_shift = torch.tensor(
        [[3.0, -0.2, 0.0, 0.4, -12.0, 1.0], [0.1, 2.6, -0.5, 0.0, 0.2, -3.0], [0.0, 0.3, 4.0, -1.0, 0, 0],
         [2.7, 0, 0, 0, 0, 0]]
    )  # fmt: skip  # ref - logp: k3 = e^x - x - 1 > 10 where x > 2.53 or x < -11
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    return prompt_ids, prompt_mask, completion_ids, completion_mask, old_shift, ref_shift, rewards


def verl_logps(model, input_ids, attention_mask, completion_ids):
    """The actor's `_forward_micro_batch` without rmpad: logits of the positions before each response token,
    / temperature (1.0), log-softmax gathered (`logprobs_from_logits`)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
    logits = logits[:, -completion_ids.size(1) - 1 : -1] / 1.0
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad()
    return out


def losses_and_grads(trainer, grad_accum: int = 2):
    """(ours, VERL's) loss and gradients on the fixed batch; also the log-probs and advantages of both."""
    model = trainer.model
    model.train()
    prompt_ids, prompt_mask, completion_ids, completion_mask, old_shift, ref_shift, rewards = fixed_batch(
        model.config.vocab_size
    )
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    with torch.no_grad():
        logp0 = verl_logps(model, input_ids, attention_mask, completion_ids)
    old, ref = logp0 - old_shift, logp0 + ref_shift
    index = ["p0"] * GROUP
    verl_adv, _ = verl.compute_grpo_outcome_advantage(
        rewards.unsqueeze(-1) * torch.eye(1, COMPLETION)[0], completion_mask.float(), index, epsilon=1e-6
    )
    ours_adv = grpo_advantages(rewards, GROUP, trainer.advantage_epsilon or 1e-4)
    trainer.current_gradient_accumulation_steps = grad_accum
    inputs = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
        "completion_mask": completion_mask, "advantages": ours_adv, "old_per_token_logps": old,
        "ref_per_token_logps": ref, "num_items_in_batch": completion_mask.sum(),
    }  # fmt: skip
    ours = trainer._compute_loss(model, inputs)
    ours.backward()
    ours_grads = grads(model)
    ours_logps, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, COMPLETION)
    log_prob = verl_logps(model, input_ids, attention_mask, completion_ids)
    theirs, _, _ = verl.verl_actor_micro_batch_loss(
        old, log_prob, ref, verl_adv, completion_mask.float(), grad_accum, clip_ratio=0.2, clip_ratio_c=3.0,
        kl_loss_coef=0.001,
    )  # fmt: skip
    theirs.backward()
    return {
        "loss": (ours.item(), theirs.item()),
        "grads": (ours_grads, grads(model)),
        "logps": (ours_logps.detach() * completion_mask, log_prob.detach() * completion_mask),
        "advantages": (ours_adv.unsqueeze(-1) * completion_mask, verl_adv),
    }


def test_loss_gradients_logps_and_advantages_equal_verl(tmp_path, tokenizer, tiny_model_dir, one_thread):
    result = losses_and_grads(make_trainer(tmp_path, tokenizer, tiny_model_dir))
    ours, theirs = result["logps"]
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    ours, theirs = result["advantages"]
    assert torch.allclose(ours, theirs, atol=1e-6, rtol=0)
    ours, theirs = result["loss"]
    assert ours == pytest.approx(theirs, abs=1e-6, rel=0)
    ours, theirs = result["grads"]
    assert len(ours) == len(theirs) > 0
    assert max((a - b).abs().max().item() for a, b in zip(ours, theirs)) < 1e-6


def test_without_our_hooks_trl_differs_from_verl(tmp_path, tokenizer, tiny_model_dir, one_thread):
    """The two hooks are needed: TRL alone (no KL clamp, its 1e-4 advantage epsilon) is off by more than 1e-6 on the
    same batch (the KL tokens past the clamp weigh 0.001 x (e^3 - 4 - 10) / tokens)."""
    trainer = make_trainer(tmp_path, tokenizer, tiny_model_dir, kl_clamp=None, advantage_epsilon=None)
    ours, theirs = losses_and_grads(trainer)["loss"]
    assert abs(ours - theirs) > 1e-5


def test_dual_clip_is_trl_delta():
    """TRL's `delta` (the unclipped ratio capped) = VERL's dual clip `clip_ratio_c`, in value and gradient, over a
    grid of ratios and both advantage signs (pure tensors: VERL's compute_policy_loss vs TRL's formula)."""
    ratio_log = torch.linspace(-3, 3, 121).repeat(2, 1).requires_grad_(True)
    advantages = torch.tensor([[1.3], [-0.7]]).expand(2, 121)
    mask = torch.ones(2, 121)
    old = torch.zeros(2, 121)
    theirs, *_ = verl.compute_policy_loss(old, ratio_log, advantages, mask, 0.2, 0.2, 0.2, 3.0, "token-mean")
    (g_theirs,) = torch.autograd.grad(theirs, ratio_log)
    coef_1 = torch.exp(ratio_log - old)
    coef_2 = torch.clamp(coef_1, 0.8, 1.2)
    coef_1 = torch.clamp(coef_1, max=3.0)  # grpo_trainer.py `_compute_loss`: `if self.args.delta is not None`
    per_token = -torch.min(coef_1 * advantages, coef_2 * advantages)
    ours = (per_token * mask).sum() / mask.sum()
    (g_ours,) = torch.autograd.grad(ours, ratio_log)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-7)
    assert torch.allclose(g_ours, g_theirs, atol=1e-8)


def test_advantages_through_trl_generation_equal_verl(tmp_path, tokenizer, tiny_model_dir, one_thread):
    """The real path: TRL generates and scores a batch of 2 prompts x 4 completions; the advantages our trainer hands
    to the loss equal VERL's `compute_grpo_outcome_advantage` on the rewards that were returned."""
    trainer = make_trainer(tmp_path, tokenizer, tiny_model_dir, per_device_train_batch_size=8)
    prompts = [[{"role": "user", "content": "1 + 1 ="}], [{"role": "user", "content": "2 + 3 ="}]]
    inputs = [{"prompt": p, "ground_truth": "2"} for p in prompts for _ in range(GROUP)]
    SCORES.clear()
    trainer.model.train()
    output = trainer._generate_and_score_completions(inputs)
    rewards = torch.tensor(SCORES)
    assert len(rewards) == 8 and rewards.view(2, GROUP).std(1).min() > 0
    verl_adv, _ = verl.compute_grpo_outcome_advantage(
        rewards.unsqueeze(-1), torch.ones(8, 1), ["a"] * GROUP + ["b"] * GROUP, epsilon=1e-6
    )
    assert torch.allclose(output["advantages"], verl_adv.squeeze(-1), atol=1e-6, rtol=0)


def test_pass_rates_logged_for_verified_rewards(tmp_path, tokenizer, tiny_model_dir):
    """0/1 rewards: pass@1 = the mean over all samples (the authors' pass@1), pass@n = prompts with a right sample."""
    trainer = make_trainer(tmp_path, tokenizer, tiny_model_dir)
    trainer.model.train()
    trainer._log_pass_rates(torch.tensor([1.0, 0, 0, 0, 0, 0, 0, 0]), GROUP)
    trainer._log_pass_rates(torch.tensor([0.5, 0, 0, 0, 0, 0, 0, 0]), GROUP)  # not 0/1: nothing logged
    assert trainer._metrics["train"]["pass@1"] == [0.125] and trainer._metrics["train"]["pass@4"] == [0.5]
