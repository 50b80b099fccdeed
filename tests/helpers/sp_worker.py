"""Run under torchrun (gloo, CPU; world = SP size): a tiny Instella with Ulysses sequence parallelism against the
same model in one process, and against the authors' split (tests/helpers/instella_long_oracle.py). Writes this
rank's largest differences to <output>/rank<R>.json; tests/e2e/test_sequence_parallel_gloo.py asserts on them.

Cases (one packed row of 24 tokens, documents told apart by position_ids restarting at 0):
- exact: logits (gathered), the loss (sum over ranks) and the gradients (summed over ranks) equal one process's;
- authors, fallback (no document longer than a chunk): each rank's logits equal the model run on each piece of the
  authors' `doc_lens` re-cut alone, and its loss is the authors' sum over the chunk's own targets / (tokens / sp);
- authors, a document longer than a chunk: the Ulysses path (the authors' `seq_parallel_group` is set) with exact
  logits and the chunk-local targets;
- authors, forced (SFT's `force_sequence_parallel`): the Ulysses path even for short documents.
"""

import copy
import json
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from instella_recipes.trainer.features import sequence_parallel as sp_module
from instella_recipes.trainer.features.sequence_parallel import SequenceParallel
from modeling_instella import InstellaConfig, InstellaForCausalLM
from tests.helpers.instella_long_oracle import authors_split

SEQ = 24


def tiny_model() -> InstellaForCausalLM:
    torch.manual_seed(0)
    config = InstellaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, attn_implementation="sdpa",
    )  # fmt: skip
    return InstellaForCausalLM(config).double()


def row(doc_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    ids = torch.randint(2, 128, (1, sum(doc_lens)))
    positions = torch.cat([torch.arange(n) for n in doc_lens])[None]
    return ids, positions


def gather(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim=1)


def exact_case(model, sp_model, sp) -> dict:
    ids, positions = row([5, 11, 8])
    model.zero_grad()
    full = model(ids, position_ids=positions, labels=ids, num_items_in_batch=SEQ)
    full.loss.backward()
    sp.mode = "exact"
    sp_model.zero_grad()
    out = sp_model(**sp.shard({"input_ids": ids, "position_ids": positions, "labels": ids}), num_items_in_batch=SEQ)
    out.loss.backward()
    loss = out.loss.detach().clone()
    dist.all_reduce(loss)
    grads = {}
    for (name, p), q in zip(model.named_parameters(), sp_model.parameters()):
        g = q.grad.clone()
        dist.all_reduce(g)
        grads[name] = float((g - p.grad).abs().max())
    return {
        "logits": float((gather(out.logits.detach()) - full.logits.detach()).abs().max()),
        "loss": abs(float(loss) - float(full.loss.detach())),
        "grad": max(grads.values()),
        "local": sp.local,
    }


def authors_case(model, sp_model, sp, doc_lens: list[int], force: bool) -> dict:
    ids, positions = row(doc_lens)
    size, rank = dist.get_world_size(), dist.get_rank()
    theirs = authors_split(ids, doc_lens, rank, size, force)
    sp.mode, sp.force = "authors", force
    with torch.no_grad():
        out = sp_model(**sp.shard({"input_ids": ids, "position_ids": positions, "labels": ids}))
        chunk = theirs["input_ids"]
        if theirs["seq_parallel_group"] is None:  # their fallback: each re-cut piece attends only to itself
            pieces = torch.split(chunk, theirs["doc_lens"][0].tolist(), dim=-1)
            expected = torch.cat([model(p).logits for p in pieces], dim=1)
        else:  # their Ulysses path: the whole row's documents, this rank's tokens
            lo = rank * (SEQ // size)
            expected = model(ids, position_ids=positions).logits[:, lo : lo + SEQ // size]
        # their loss: the chunk's own targets (input_ids shifted inside the chunk), summed, / (numel / sp)
        their_loss = F.cross_entropy(expected[0, :-1], chunk[0, 1:], reduction="sum") / (ids.numel() / size)
        ours = sp_model(
            **sp.shard({"input_ids": ids, "position_ids": positions, "labels": ids}), num_items_in_batch=SEQ / size
        )
        lo = rank * (SEQ // size)
        exact = model(ids, position_ids=positions).logits[:, lo : lo + SEQ // size]
    return {
        "logits": float((out.logits - expected).abs().max()),
        "from_exact": float((out.logits - exact).abs().max()),  # > 0 only where the authors approximate
        "loss": abs(float(ours.loss) - float(their_loss)),
        "same_path": sp.local == (theirs["seq_parallel_group"] is None),
        "local": sp.local,
    }


def main(output: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    size = dist.get_world_size()
    model = tiny_model()
    sp_model = copy.deepcopy(model)
    sp = SequenceParallel.create(size)
    sp_module.enable(sp_model, sp)
    chunk = SEQ // size
    # none longer than a chunk, and some straddle a chunk border (at 12, or at 6, 12 and 18)
    short_docs = {2: [7, 10, 7], 4: [5, 6, 3, 6, 4]}[size]
    results = {
        "exact": exact_case(model, sp_model, sp),
        "authors_fallback": authors_case(model, sp_model, sp, short_docs, force=False),
        "authors_long_doc": authors_case(model, sp_model, sp, [3, chunk + 2, SEQ - chunk - 5], force=False),
        "authors_forced": authors_case(model, sp_model, sp, short_docs, force=True),
    }
    with open(f"{output}/rank{dist.get_rank()}.json", "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
