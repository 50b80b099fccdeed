"""Stage 1 -> stage 2 AdamW state under FSDP2: 2 ranks write their optimizer shards as one DCP checkpoint
(`save_optimizer_state`), and a run on another world size (here one process, no FSDP) loads exactly the gathered
moments and step counts (`load_optimizer_state`), keeping its own LR and hyperparameters."""

import os
import subprocess
import sys
from pathlib import Path

import torch

from instella_recipes.trainer.features.optimizer_state import check_optimizer_state, load_optimizer_state
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config

ROOT = Path(__file__).resolve().parents[2]


def test_sharded_optimizer_state_loads_on_another_world_size(tmp_path):
    out, reference = tmp_path / "optimizer_state", tmp_path / "reference.pt"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "tests/helpers/optimizer_state_worker.py"), str(out), str(reference),
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list(out.glob("*.distcp"))) == 2  # one shard file per rank
    saved = torch.load(reference, weights_only=False)

    model = InstellaForCausalLM(
        tiny_config(hidden_size=32, intermediate_size=48, vocab_size=96, num_attention_heads=2)
    )
    model.load_state_dict(saved["model"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-5, betas=(0.9, 0.95), weight_decay=0.1)
    load_optimizer_state(model, optimizer, check_optimizer_state(out))
    names = {id(p): n for n, p in model.named_parameters()}
    for param, state in optimizer.state.items():
        expected = saved["optim"]["state"][names[id(param)]]
        assert float(state["step"]) == float(expected["step"]) == 2
        torch.testing.assert_close(state["exp_avg"], expected["exp_avg"], rtol=0, atol=0)
        torch.testing.assert_close(state["exp_avg_sq"], expected["exp_avg_sq"], rtol=0, atol=0)
    assert len(optimizer.state) == len(list(model.parameters()))
    group = optimizer.param_groups[0]
    assert group["lr"] == 4e-5 and "initial_lr" not in group  # the new stage's LR; its LambdaLR starts clean
