"""lm-eval loglikelihood throughput (requests/s) on a tiny Instella checkpoint: `batch_size=auto` vs `batch_size=1`.

    python benchmarks/bench_lm_eval_batch.py [--tasks tiny_world_mc,amd_llama_135m_offline] [--repeats 3]

Both runs score the same loglikelihood requests (the multiple-choice items of our offline tasks, every choice a
request) with lm-eval's own `HFLM` loading the checkpoint through trust_remote_code; only the model calls are timed
(the best of `--repeats`). The checkpoint is the test suite's tiny Instella (hidden 64, 2 layers, a 512-id BPE on
the TinyWorld corpus), saved to a temporary folder.
"""

import argparse
import shlex
import sys
import tempfile
import time
from pathlib import Path

import torch

import modeling_instella  # noqa: F401  (registers "instella")

try:  # run as a file (`python benchmarks/bench_lm_eval_batch.py`), the repository root is not on the path
    from benchmarks.results_io import record
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.results_io import record
from instella_recipes.data.tiny_world import TinyWorld
from instella_recipes.data.tokenizer import train_bpe_tokenizer
from modeling_instella import InstellaConfig, InstellaForCausalLM

TASKS_DIR = Path(__file__).resolve().parents[1] / "eval" / "tasks"


def tiny_checkpoint(folder: Path) -> Path:
    tok = train_bpe_tokenizer([r["text"] for r in TinyWorld().corpus()], vocab_size=512)
    torch.manual_seed(0)
    config = InstellaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=256,
    )  # fmt: skip
    InstellaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def loglikelihood_requests(tasks: list[str]):
    from lm_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    requests = []

    def collect(node):
        for value in node.values():
            if isinstance(value, dict):
                collect(value)
            elif value.config.output_type == "multiple_choice":
                value.build_all_requests()
                requests.extend(value.instances)

    collect(get_task_dict(tasks, manager))
    return requests


def time_requests(lm, requests, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        lm.loglikelihood(requests, disable_tqdm=True)
        best = min(best, time.perf_counter() - start)
    return best


def main(argv=None) -> int:
    from lm_eval.models.huggingface import HFLM

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="tiny_world_mc,amd_llama_135m_offline")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max_batch_size", type=int, default=64)
    args = parser.parse_args(argv)
    requests = loglikelihood_requests(args.tasks.split(","))
    with tempfile.TemporaryDirectory() as folder:
        path = tiny_checkpoint(Path(folder))
        results = {}
        for batch_size in ("1", "auto"):
            lm = HFLM(
                pretrained=str(path), trust_remote_code=True, batch_size=batch_size,
                max_batch_size=args.max_batch_size, device="cpu",
            )  # fmt: skip
            seconds = time_requests(lm, requests, args.repeats)
            chosen = getattr(lm, "batch_sizes", {}) or {}
            results[batch_size] = (seconds, chosen)
    one, auto = results["1"][0], results["auto"][0]
    body = (
        f"{len(requests)} loglikelihood requests ({args.tasks}), tiny Instella (hidden 64, 2 layers) via "
        f"lm-eval's HFLM + trust_remote_code, best of {args.repeats}.\n\n"
        "| batch_size | seconds | requests/s |\n|---|---|---|\n"
        f"| 1 | {one:.2f} | {len(requests) / one:.1f} |\n"
        f"| auto (max {args.max_batch_size}) | {auto:.2f} | {len(requests) / auto:.1f} |\n\n"
        f"auto / 1 throughput: {one / auto:.2f}x."
    )
    command = "python benchmarks/bench_lm_eval_batch.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    print(body)
    path = record("lm_eval_batch", "lm-eval loglikelihood throughput: batch_size auto vs 1", body, command.strip())
    print(f"recorded {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
