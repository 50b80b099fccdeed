"""Training throughput of the tiny stage-1 recipe (recipes/tiny/pretrain_stage1.yaml) with and without
`torch_compile`, through scripts/pretrain.py itself. Steady state: the first `--warmup` steps (compilation) are
excluded; tokens/s = global batch x window / mean step time.

    python benchmarks/bench_tiny_compile.py [--steps 40 --warmup 10]
"""

import argparse
import json
import tempfile
import time
from pathlib import Path

from transformers import TrainerCallback

_TIMES: list[float] = []


class _StepTimer(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _TIMES.append(time.perf_counter() - self.start)


def timer(model, plugin_args):
    """Plugin (scripts/pretrain.py `plugins:`) that records each optimizer step's wall time."""
    return [_StepTimer()]


def run(data_dir: Path, out: Path, steps: int, compile_: bool) -> list[float]:
    import importlib

    from instella_recipes.pretraining.pretrain import main

    times = importlib.import_module("benchmarks.bench_tiny_compile")._TIMES  # the plugin's copy, not __main__'s
    times.clear()
    argv = ["--config", "recipes/tiny/pretrain_stage1.yaml", "--data_dir", str(data_dir), "--output_dir", str(out),
            "--max_steps", str(steps), "--torch_compile", str(compile_).lower(), "--save_strategy", "no",
            "--plugins", "benchmarks.bench_tiny_compile:timer", "--logging_steps", "1000"]  # fmt: skip
    assert main(argv) == 0
    return list(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=10)
    args = parser.parse_args()
    from instella_recipes.core import parse_recipe
    from instella_recipes.data.prepare import PrepareArguments, prepare

    work = Path(tempfile.mkdtemp(prefix="bench_compile_"))
    (prep,) = parse_recipe([PrepareArguments], ["--config", "recipes/tiny/prepare_data.yaml"])
    prep.output_dir = str(work / "data")
    data_dir = prepare(prep)
    manifest = json.loads((data_dir / "manifest.json").read_text())
    tokens_per_step = 8 * manifest["seq_len"]
    rows = []
    for compile_ in (False, True):
        times = run(data_dir, work / f"run-{compile_}", args.steps, compile_)
        steady = times[args.warmup :]
        mean = sum(steady) / len(steady)
        rows.append((compile_, sum(times[: args.warmup]), mean, tokens_per_step / mean))
    eager, compiled = rows
    body = (
        f"Tiny Instella (hidden 128, 4 layers, vocab 512), global batch 8 x {manifest['seq_len']} tokens, fp32, "
        f"1 thread (the recipe's torch_num_threads); {args.steps} steps, the first {args.warmup} excluded.\n\n"
        "| torch_compile | first steps (s) | mean step (ms) | tokens/s |\n|---|---|---|---|\n"
        + "".join(f"| {c} | {w:.1f} | {m * 1000:.1f} | {t:,.0f} |\n" for c, w, m, t in rows)
        + f"\n**Speedup with compile: {compiled[3] / eager[3]:.2f}x** (steady state)."
    )
    print(body)
    from benchmarks.results_io import record

    record("tiny_compile", "Tiny pretraining throughput with and without torch.compile", body)


if __name__ == "__main__":
    main()
