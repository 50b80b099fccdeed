"""SFT loss normalisation as the authors' `normalize_by_label_mask` (SPEC.md 2.1): each device's loss is its summed
token cross-entropy over *its own* label count (over all its accumulation micro-batches), then the gradients are
averaged over devices. Checked on 2 gloo/CPU processes with unequal label counts through the real SFT trainer,
against the same gradient computed here by hand; the recipe field is `average_tokens_across_devices: false`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

ROOT = Path(__file__).resolve().parents[2]


def _conversations() -> list[dict]:
    """4 rows whose assistant answers differ a lot in length: the two devices get unequal label counts."""
    answers = ["5.", "It is five, because two plus three makes five. " * 3, "Five.", "The answer is 5. " * 2]
    return [
        {"messages": [{"role": "user", "content": f"What is 2 + 3? ({i})"}, {"role": "assistant", "content": a}]}
        for i, a in enumerate(answers)
    ]


def _hand_gradient(model_dir, ranks: list[list[dict]], per_device: bool) -> dict:
    """The authors' rule (per_device) or one mean over the global batch's label tokens, by hand."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    counts = [sum(int((row["labels"][..., 1:] != -100).sum()) for row in rows) for rows in ranks]
    total = torch.zeros(())
    for rows, count in zip(ranks, counts):
        for row in rows:
            logits = model(input_ids=row["input_ids"]).logits[..., :-1, :]
            ce = F.cross_entropy(logits.flatten(0, 1), row["labels"][..., 1:].flatten(), reduction="sum")
            total = total + (ce / count / len(ranks) if per_device else ce / sum(counts))
    total.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}, counts


def test_sft_loss_is_normalised_per_device_then_averaged(tiny_model_dir, tmp_path):
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _conversations()))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "tests/helpers/sft_loss_worker.py"), str(tiny_model_dir), str(data), str(tmp_path),
        "--average_tokens_across_devices", "false",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    ranks = [rec["rows"] for rec in records]
    assert [len(rows) for rows in ranks] == [2, 2]

    expected, counts = _hand_gradient(tiny_model_dir, ranks, per_device=True)
    assert counts[0] != counts[1]  # unequal label counts: the two rules differ
    global_mean, _ = _hand_gradient(tiny_model_dir, ranks, per_device=False)
    for rec in records:  # DDP all-reduced: both ranks hold the averaged gradient
        for name, grad in rec["grads"].items():
            torch.testing.assert_close(grad, expected[name], rtol=1e-4, atol=1e-7)
    name = "lm_head.weight"
    assert not torch.allclose(global_mean[name], expected[name], rtol=1e-2, atol=0)
