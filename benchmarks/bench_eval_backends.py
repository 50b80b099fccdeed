"""Evaluation throughput (items/s), lm-eval's `hf` vs `vllm` model on one checkpoint, as a ratio in one run.

    python benchmarks/bench_eval_backends.py [--hidden_size 256] [--layers 4] [--repeats 2]
    INSTELLA_VLLM_PYTHON=/path/to/venv/bin/python python benchmarks/bench_eval_backends.py   # another vLLM venv

Both backends score the same items of the demo's offline tasks: `tiny_world_mc` (24 items, 4 loglikelihood requests
each) and `tiny_world_arithmetic` (60 items, greedy generation up to 32 tokens). Each backend runs in its own
process with its own Python (hf: this one; vllm: the project's vLLM venv, `make vllm-env`): the model is loaded once,
the requests are built by lm-eval's TaskManager from eval/tasks, and only `lm.loglikelihood(...)` /
`lm.generate_until(...)` are timed (best of `--repeats`), so start-up (vLLM's engine, ~40 s on CPU) is not counted.
float32 on CPU (vLLM: eager, 1 GiB KV cache); on a GPU, bfloat16 and vLLM's CUDA graphs. The checkpoint is a random
Instella (TinyWorld BPE tokenizer) saved to a temporary folder; head size 64 (vLLM's CPU attention has no kernel for
16).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

try:  # run as a file (`python benchmarks/bench_eval_backends.py`), the repository root is not on the path
    from benchmarks.results_io import record
except ModuleNotFoundError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.results_io import record
from instella_recipes.data.tiny_world import TinyWorld
from instella_recipes.data.tokenizer import train_bpe_tokenizer
from instella_recipes.evaluation.preflight import vllm_environment, vllm_python
from modeling_instella import InstellaConfig, InstellaForCausalLM

ROOT = Path(__file__).resolve().parents[1]
TASKS = {"loglikelihood": "tiny_world_mc", "generation": "tiny_world_arithmetic"}

# Run by each backend's Python (stdlib + lm-eval only); vLLM's engine is a spawned process, hence the __main__ guard.
DRIVER = r"""
import json, sys, time
from lm_eval.api.registry import get_model
from lm_eval.tasks import TaskManager, get_task_dict

def main():
    backend, model_args, tasks_dir, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    extra = {"batch_size": "auto"}
    if backend == "hf":
        import torch
        extra["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    lm = get_model(backend).create_from_arg_string(model_args, extra)
    manager = TaskManager(include_path=tasks_dir, include_defaults=False)
    out = {}
    for kind, task_name in json.loads(sys.argv[5]).items():
        task = get_task_dict([task_name], manager)[task_name]
        task.build_all_requests()
        requests = task.instances
        items = len({r.doc_id for r in requests})
        run = lm.loglikelihood if kind == "loglikelihood" else lm.generate_until
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            run([r for r in requests])
            best = min(best, time.perf_counter() - start)
        out[kind] = {"items": items, "requests": len(requests), "seconds": best}
    print("RESULT " + json.dumps(out), flush=True)

if __name__ == "__main__":
    main()
"""


def checkpoint(folder: Path, hidden_size: int, layers: int) -> Path:
    tok = train_bpe_tokenizer([r["text"] for r in TinyWorld().corpus()], vocab_size=512)
    torch.manual_seed(0)
    config = InstellaConfig(
        vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=4 * hidden_size, num_hidden_layers=layers,
        num_attention_heads=hidden_size // 64, max_position_embeddings=512,
    )  # fmt: skip
    InstellaForCausalLM(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def run_backend(backend: str, model: Path, driver: Path, repeats: int) -> dict:
    cpu = not torch.cuda.is_available()
    dtype = "float32" if cpu else "bfloat16"
    args = f"pretrained={model},trust_remote_code=True,dtype={dtype}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    python = sys.executable
    if backend == "vllm":
        python = str(vllm_python())
        args += ",max_model_len=512" + (",enforce_eager=True" if cpu else "")
        env = {**vllm_environment(Path(python)), **{k: v for k, v in env.items() if k.startswith("HF_")}}
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    cmd = [python, str(driver), backend, args, str(ROOT / "eval" / "tasks"), str(repeats), json.dumps(TASKS)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    if done.returncode != 0 or line is None:
        raise SystemExit(f"error: the {backend} run failed:\n{done.stderr[-3000:]}")
    return json.loads(line.removeprefix("RESULT "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not vllm_python().is_file():
        print(f"error: no vLLM venv at {vllm_python()}: make vllm-env (or set INSTELLA_VLLM_PYTHON)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        model = checkpoint(Path(tmp) / "model", args.hidden_size, args.layers)
        driver = Path(tmp) / "driver.py"
        driver.write_text(DRIVER)
        results = {backend: run_backend(backend, model, driver, args.repeats) for backend in ("hf", "vllm")}
    rows = ["| task (request type) | items | hf items/s | vllm items/s | vllm / hf |", "|---|---|---|---|---|"]
    for kind, task in TASKS.items():
        hf, vllm = results["hf"][kind], results["vllm"][kind]
        hf_rate, vllm_rate = hf["items"] / hf["seconds"], vllm["items"] / vllm["seconds"]
        ratio = vllm_rate / hf_rate
        rows.append(f"| {task} ({kind}) | {hf['items']} | {hf_rate:.2f} | {vllm_rate:.2f} | {ratio:.2f} |")
        print(f"{task}: hf {hf_rate:.2f} items/s, vllm {vllm_rate:.2f} items/s, ratio {vllm_rate / hf_rate:.2f}")
    body = (
        f"A random Instella (hidden {args.hidden_size}, {args.layers} layers, head size 64, 512-id TinyWorld BPE), "
        "the same items through lm-eval's `hf` model (batch_size auto) and its `vllm` model (the project's vLLM "
        "venv); only the scoring calls are timed, best of "
        f"{args.repeats}. On CPU: float32, vLLM eager with a 1 GiB KV cache, on a shared 2-core machine.\n\n"
        + "\n".join(rows)
    )
    record("eval_backends", "Evaluation throughput, lm-eval hf vs vllm", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
