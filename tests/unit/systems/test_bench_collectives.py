"""Collective microbenchmarks: bus-bandwidth formulas, bad input, and real 2- and 4-process gloo runs."""

import csv

import pytest

from instella_recipes.systems.collectives import bus_factor, parse_size, size_sweep
from instella_recipes.systems.collectives import main as bench_main


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


def test_single_process_without_launcher(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    bench_main(["--backend", "gloo", "--sizes", "1K", "--warmup", "0", "--iters", "1", "--output_dir", str(tmp_path)])
    rows = list(csv.DictReader(open(tmp_path / "results.csv")))
    assert len(rows) == 5 and all(row["correct"] == "True" and row["world_size"] == "1" for row in rows)
    assert all(float(row["busbw_gbps"]) == 0.0 for row in rows if row["collective"] != "broadcast")  # (n-1)/n = 0
