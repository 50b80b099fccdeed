"""Run under torchrun (tests only): train a tiny Instella one AdamW step under FSDP2 `fully_shard` on gloo/CPU and
save model + optimizer with DCP from every rank; rank 0 also saves the full (gathered) reference state as a .pt.
Then ranks 0 and 1 (a 2-process group) reshape the 4-writer checkpoint into a 2-writer one with `reshard`: one
launch covers N=4 -> M=2 (each torchrun start costs tens of seconds on the CI machine). The same 2 ranks then resume
from the 2-writer checkpoint into a fresh 2-way `fully_shard` model + optimizer (what a resized training run does) and
rank 0 saves that state, gathered, beside the reference."""

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard

from instella_recipes.checkpoint.reshape import reshard
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


def build(config, mesh=None):
    torch.manual_seed(1)  # different from the trained weights: a resume must overwrite every tensor
    model = InstellaForCausalLM(config)
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main(out: str, reference: str, config_dir: str, resharded: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    config = tiny_config(hidden_size=32, intermediate_size=48, vocab_size=96, num_attention_heads=2)
    torch.manual_seed(0)
    model = InstellaForCausalLM(config)
    if dist.get_rank() == 0:
        config.save_pretrained(config_dir)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(dist.get_rank()))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=out)
    full = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save({"model": full[0], "optim": full[1]}, reference)
    pair = dist.new_group([0, 1])
    if dist.get_rank() < 2:
        reshard(out, resharded, group=pair, config=config)
        model, optimizer = build(config, DeviceMesh.from_group(pair, "cpu"))
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=resharded, process_group=pair)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        full = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() == 0:
            torch.save({"model": full[0], "optim": full[1]}, reference.replace(".pt", "_resumed_m2.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:5])
