"""The benchmark suites cannot rot: `make bench-gpu SMOKE=1` (benchmarks/bench_gpu.py --smoke) and the trained
speculative-decoding benchmark run every code path at toy size on CPU; the numbers they compute are checked against
hand computations (SPEC.md 6 MFU, the micro-batch search), not against themselves."""

import json

import pytest
import torch

from benchmarks import bench_gpu, bench_speculative
from instella_recipes.training import flops


@pytest.mark.parametrize(
    ("limit", "cap", "expected", "calls"),
    [
        (5, 64, (5, False), [1, 2, 4, 8, 6, 5]),  # doubling to the first miss (8), then bisection 4..8
        (64, 8, (8, True), [1, 2, 4, 8]),  # everything fits: stops at the cap and says so
        (0, 8, (0, False), [1]),  # not even one fits
        (1, 8, (1, False), [1, 2]),
    ],
)
def test_largest_fitting_micro_batch(limit, cap, expected, calls):
    tried = []

    def fits(n):
        tried.append(n)
        return n <= limit

    assert bench_gpu.largest_fitting(fits, cap) == expected
    assert tried == calls


def test_out_of_memory_step_is_a_status_not_a_crash(monkeypatch):
    model = torch.nn.Linear(2, 2)

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated)")

    monkeypatch.setattr(bench_gpu, "make_step", oom)
    result = bench_gpu.measure(model, torch.device("cpu"), 4, 8, 1, 0, False, 1.0, None)
    assert result == {"status": "OOM", "batch": 4}


def test_peer_configs_have_instellas_shape():
    reference = bench_gpu.config_for("instella", smoke=False)
    assert (reference.hidden_size, reference.num_hidden_layers, reference.vocab_size) == (2560, 36, 50304)
    assert flops.count_params_from_config(reference).total == 3_112_675_840  # SPEC.md 6
    for arch in ("olmo2", "llama"):
        config = bench_gpu.config_for(arch, smoke=False)
        assert config.model_type == arch
        assert all(getattr(config, k) == getattr(reference, k) for k in bench_gpu.SHAPE_FIELDS)


def test_bench_gpu_smoke_runs_every_section(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    # a made-up peak (1 TFLOP/s) so the MFU code path runs on CPU too
    assert bench_gpu.main(["--smoke", "--peak_tflops", "1", "--output", str(out)]) == 0
    results = json.loads(out.read_text())
    rows, info = results["train"]
    measured = [r for r in rows if r.get("status") == "ok"]
    assert {(r["compile"], r["checkpointing"]) for r in measured} == {(False, False), (False, True), (True, False)}
    # SPEC.md 6 by hand: 6N + 12 L H Q T, N = all parameters but the input embedding (the lm_head counts)
    config = bench_gpu.config_for("instella", smoke=True)
    model = bench_gpu.build("instella", config, "sdpa", "cpu")
    n = sum(p.numel() for p in model.parameters()) - model.get_input_embeddings().weight.numel()
    head_dim = config.hidden_size // config.num_attention_heads
    by_hand = 6 * n + 12 * config.num_hidden_layers * config.num_attention_heads * head_dim * 32
    assert info["flops_token"] == by_hand
    for r in measured:
        assert r["tokens_per_s"] == pytest.approx(32 / r["step_s"])
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * by_hand / 1e12)
    assert any(r["attn"] == "flash_attention_2" for r in rows)  # measured, or the reason it was not
    # with activation checkpointing, and without it when the fastest row had none; the smoke search stops at its cap
    assert info["micro"]["true"] == [2, True] and all(v == [2, True] for v in info["micro"].values())
    peers = {r["arch"]: r for r in results["peers"]}
    assert set(peers) == {"instella", "olmo2", "llama"} and all(r["status"] == "ok" for r in peers.values())
    assert peers["instella"]["params"] == peers["olmo2"]["params"]  # same ops; Llama lacks only the QK-norm weights
    assert peers["instella"]["params"] - peers["llama"]["params"] == config.num_hidden_layers * 2 * config.hidden_size
    assert all("status" in r or ("plain" in r and "liger" in r) for r in results["liger"])
    spec = results["speculative"]
    assert spec["assisted"]["identical"] is True
    assert spec["c"] == pytest.approx(spec["decode_s"]["draft"] / spec["decode_s"]["target"])
    report = capsys.readouterr().out
    assert "MFU" in report and "Largest micro-batch" in report and "bound at a = 0.66" in report


def test_bench_speculative_smoke_trains_and_decodes(capsys):
    assert bench_speculative.main(["--smoke"]) == 0
    report = capsys.readouterr().out
    assert "| target |" in report and "| draft |" in report
    row = next(line for line in report.splitlines() if line.startswith("| 2 |"))
    assert row.rstrip().endswith("2/2 |")  # greedy output identical with and without the draft, both prompts


def test_stdlib_corpus_is_real_python():
    texts = bench_speculative.stdlib_sources(limit_bytes=50_000)
    assert texts and all(compile(t, "<stdlib>", "exec") for t in texts)
