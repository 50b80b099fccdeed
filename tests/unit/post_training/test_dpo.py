"""DPO recipe: the authors' length-normalised loss (dpo_norm = TRL's sigmoid_norm) against a hand computation, the
completion mask and precomputed reference log-probs; tiny DPO training: tests/e2e/test_dpo_train_learns.py. Multi-turn
scoring and the loss against open-instruct's rules: test_exactness_dpo.py."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from trl import ModelConfig

from instella_recipes.core import parse_recipe
from instella_recipes.post_training import dpo

TINY_DPO = str(Path(__file__).resolve().parents[3] / "recipes" / "tiny" / "dpo.yaml")


pytestmark = pytest.mark.usefixtures("one_thread")


def recipe(model_dir, out, *extra):
    argv = ["--config", TINY_DPO, "--model_name_or_path", str(model_dir), "--output_dir", str(out), *extra]
    return argv, parse_recipe([dpo.CheckedDPOConfig, ModelConfig], argv)


def completion_logps(model, batch):
    """Summed log-probs of the completion tokens and their count, from the plain logits (no TRL code)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
    per_token = torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["completion_mask"][:, 1:].float()
    return (per_token * mask).sum(1), mask.sum(1)


def test_dpo_norm_equals_hand_computation(tiny_model_dir, tmp_path):
    _, (training_args, model_args) = recipe(tiny_model_dir, tmp_path / "out", "--max_samples", "16")
    trainer, _ = dpo.build_trainer(training_args, model_args)
    assert trainer.loss_types == ["sigmoid_norm"] and trainer.beta == 5.0
    torch.manual_seed(0)
    with torch.no_grad():  # make the policy differ from the reference so the loss is not log(2)
        for p in trainer.model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    examples = [trainer.train_dataset[i] for i in range(4)]
    batch = trainer.data_collator(examples)
    # single-turn pairs: the scored tokens are the assistant answer + its EOS, nothing of the prompt
    decode = trainer.processing_class.decode
    for row, mask in zip(batch["input_ids"], batch["completion_mask"], strict=True):
        first = int(mask.argmax())
        assert decode(row[:first]).endswith("<|assistant|>\n") and mask[first:].tolist() == sorted(mask[first:])[::-1]
        assert decode(row[mask.bool()]).endswith("<|endoftext|>") and "<|" not in decode(row[mask.bool()])[:-13]

    loss = trainer.compute_loss(trainer.model, dict(batch))
    with torch.no_grad():
        policy, n_tokens = completion_logps(trainer.model, batch)
        ref, _ = completion_logps(trainer.ref_model, batch)
    avg_policy, avg_ref = policy / n_tokens, ref / n_tokens  # averaged over response tokens: dpo_norm
    pc, pr = avg_policy.chunk(2)
    rc, rr = avg_ref.chunk(2)
    expected = -F.logsigmoid(5.0 * ((pc - rc) - (pr - rr))).mean()
    assert abs(expected.item() - F.softplus(torch.tensor(0.0)).item()) > 1e-3  # not the trivial log 2
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-4, atol=1e-5)


def test_precomputed_reference_log_probs(tiny_model_dir, tmp_path):
    _, (training_args, model_args) = recipe(
        tiny_model_dir, tmp_path / "out", "--precompute_ref_log_probs", "true", "--max_samples", "16"
    )
    trainer, _ = dpo.build_trainer(training_args, model_args)
    assert trainer.ref_model is None  # no reference model kept for training
    examples = [trainer.train_dataset[i] for i in range(3)]
    batch = trainer.data_collator(examples)
    with torch.no_grad():
        ref, _ = completion_logps(trainer.model, batch)
    torch.testing.assert_close(batch["ref_chosen_logps"].float(), ref[:3], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(batch["ref_rejected_logps"].float(), ref[3:], rtol=1e-4, atol=1e-4)
