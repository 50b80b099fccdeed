"""Collective microbenchmarks: bus-bandwidth formulas, bad input, and real 2- and 4-process gloo runs."""

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from instella_recipes.systems.collectives import bus_factor, parse_size, size_sweep
from instella_recipes.systems.collectives import main as bench_main

ROOT = Path(__file__).resolve().parents[1]


def test_nccl_tests_bus_factors_and_sizes():
    assert bus_factor("all_reduce", 8) == 2 * 7 / 8
    assert bus_factor("reduce_scatter", 8) == bus_factor("all_gather", 8) == bus_factor("all_to_all", 8) == 7 / 8
    assert bus_factor("broadcast", 8) == 1.0
    assert parse_size("1K") == 1024 and parse_size("4MiB") == 4 << 20 and parse_size("1G") == 1 << 30
    assert size_sweep("1K", "1G", 2)[::10] == [1 << 10, 1 << 20, 1 << 30] and len(size_sweep("1K", "1G", 2)) == 21


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--collectives", "all_reduce", "gather"], "unsupported collective(s) ['gather']"),
        (["--dtype", "complex64"], "unsupported dtype 'complex64'"),
        (["--sizes", "1K", "1030"], "not a multiple of the float32 element size"),
        (["--sizes", "12", "--collectives", "reduce_scatter"], "not divisible by the world size 4"),
        (["--sizes", "1Q"], "not a size like"),
    ],
)
def test_bad_input_is_a_clear_error_before_any_communication(argv, message, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        bench_main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


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


def test_single_process_without_launcher(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    bench_main(["--backend", "gloo", "--sizes", "1K", "--warmup", "0", "--iters", "1", "--output_dir", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 5 and all(row["correct"] == "True" and row["world_size"] == "1" for row in rows)
    assert all(float(row["busbw_gbps"]) == 0.0 for row in rows if row["collective"] != "broadcast")  # (n-1)/n = 0
