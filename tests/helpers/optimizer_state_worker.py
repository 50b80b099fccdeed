"""Run under torchrun (tests only, gloo/CPU): a tiny Instella under FSDP2 `fully_shard` takes one AdamW step, then
every rank writes its optimizer shards with `save_optimizer_state` (what stage 1 does at its end); rank 0 also saves
the full (gathered) model and optimizer state as the reference for tests/e2e/test_exactness_optimizer_state.py."""

import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard

from instella_recipes.trainer.features.optimizer_state import save_optimizer_state
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


def main(out: str, reference: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = InstellaForCausalLM(
        tiny_config(hidden_size=32, intermediate_size=48, vocab_size=96, num_attention_heads=2)
    )
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(2):
        ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(10 * dist.get_rank() + step))
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    save_optimizer_state(model, optimizer, out)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state = {
        "model": get_model_state_dict(model, options=full),
        "optim": get_optimizer_state_dict(model, optimizer, options=full),
    }
    if dist.get_rank() == 0:
        torch.save(state, reference)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
