"""The end-to-end half of tests/unit/modeling/test_modeling_conventions.py
(processes, whole runs, oracles); the in-process tests are there.

transformers' conventions for a new model, each checked against Llama's / OLMo-2's classes or by running it:
Auto classes and auto_map, forward signatures, attentions / hidden states, the loading rule (strict for checkpoints,
transformers' contract for heads and for no checkpoint), parallel plans (tensor parallel run on 2 gloo processes),
attention back-ends."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from modeling_instella import InstellaForCausalLM
from tests.unit.modeling import test_modeling_conventions as unit_half  # fixtures and helpers both halves use

seeded = unit_half.seeded


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_tensor_parallel_on_two_gloo_processes_matches_one(tmp_path):
    reference = seeded(InstellaForCausalLM)
    reference.save_pretrained(tmp_path / "model")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(ROOT / "tests/helpers/tp_worker.py"), str(tmp_path / "model"), str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        expected = reference(torch.arange(2, 12)[None]).logits
    for rank in (0, 1):
        out = torch.load(tmp_path / f"rank{rank}.pt")
        assert out["q_proj_local"] == (32, 64)  # half of the 64 output features on each rank
        assert (out["logits"] - expected).abs().max() < 1e-5
