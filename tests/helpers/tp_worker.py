"""Run under torchrun (gloo, CPU): load a saved Instella with tensor parallelism (`tp_plan="auto"`, the plan the
model class declares) and write this rank's logits and its local q_proj shape to <output>/rank<R>.pt."""

import sys

import torch
import torch.distributed as dist
from transformers import DistributedConfig

from modeling_instella import InstellaForCausalLM


def main(model_dir: str, output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    model = InstellaForCausalLM.from_pretrained(
        model_dir, distributed_config=DistributedConfig(tp_plan="auto"), dtype=torch.float32
    ).eval()
    q_proj = model.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        logits = model(torch.arange(2, 12)[None]).logits
    local = q_proj.to_local() if hasattr(q_proj, "to_local") else q_proj
    torch.save({"logits": logits, "q_proj_local": tuple(local.shape)}, f"{output}/rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
