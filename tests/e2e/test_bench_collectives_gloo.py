"""The end-to-end half of tests/unit/systems/test_bench_collectives.py
(processes, whole runs, oracles); the in-process tests are there.

Collective microbenchmarks: bus-bandwidth formulas, bad input, and real 2- and 4-process gloo runs."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from instella_recipes.systems.collectives import bus_factor

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_gloo_runs_2_and_4_processes_are_correct_and_write_csv_json_plot(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runs = {}
    for world in (2, 4):  # both launches at once: most of a torchrun's time is process start-up
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
            str(ROOT / "scripts" / "bench_collectives.py"), "--backend", "gloo", "--sizes", "1K", "16K",
            "--dtype", "bfloat16" if world == 4 else "float32", "--warmup", "1", "--iters", "2",
            "--output_dir", str(tmp_path / str(world)),
        ]  # fmt: skip
        runs[world] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for world, process in runs.items():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr[-3000:]
        check_outputs(tmp_path / str(world), world)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU for NCCL/RCCL")
def test_nccl_run_on_the_visible_gpus(tmp_path):
    world = min(torch.cuda.device_count(), 8)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
        str(ROOT / "scripts" / "bench_collectives.py"), "--sizes", "1K", "16K", "--dtype", "bfloat16",
        "--warmup", "1", "--iters", "2", "--output_dir", str(tmp_path),
    ]  # fmt: skip
    done = subprocess.run(command, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert rows and all(row["backend"] == "nccl" and row["correct"] == "True" for row in rows)


def check_outputs(out, world):
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert len(rows) == 5 * 2
    assert {row["collective"] for row in rows} == {
        "all_reduce",
        "reduce_scatter",
        "all_gather",
        "broadcast",
        "all_to_all",
    }
    for row in rows:
        assert row["correct"] == "True" and row["world_size"] == str(world) and row["backend"] == "gloo"
        algbw, busbw = float(row["algbw_gbps"]), float(row["busbw_gbps"])
        assert algbw > 0 and busbw == pytest.approx(algbw * bus_factor(row["collective"], world))
        assert float(row["size_bytes"]) / (float(row["time_us"]) * 1e-6) / 1e9 == pytest.approx(algbw)
    assert len(json.loads((out / "results.json").read_text())) == 10
    png = (out / "busbw.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 5000
