"""The benchmark suites cannot rot: `make bench-gpu SMOKE=1` (benchmarks/bench_gpu.py --smoke) and the trained
speculative-decoding benchmark run every code path at toy size on CPU; the numbers they compute are checked against
hand computations (SPEC.md 6 MFU, the micro-batch search), not against themselves."""

import json

import pytest
import torch

from benchmarks import bench_gpu, bench_speculative
from instella_recipes.trainer import flops


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
    # the one-GPU fine-tune recipes via post_training/sft.py's build_trainer at toy size (their step time on a GPU)
    finetune = {r["kind"]: r for r in results["finetune"]}
    assert set(finetune) == {"lora", "full"} and all(r["status"] == "ok" for r in finetune.values())
    assert all(r["tokens_per_step"] == 2 * 32 and r["step_s"] > 0 for r in finetune.values())
    assert finetune["lora"]["sizing_gb"] < finetune["full"]["sizing_gb"]  # a frozen bf16 base, adapters only
    # the long-context section: each length at micro-batch 1 with the sizing estimate beside it
    long_rows = results["long"]
    assert [r["seq"] for r in long_rows] == [64, 128] and all(r["status"] == "ok" for r in long_rows)
    assert long_rows[0]["sizing_gb"] < long_rows[1]["sizing_gb"]  # activations grow with the length
    report = capsys.readouterr().out
    assert "at long context on one GPU" in report
    assert "MFU" in report and "Largest micro-batch" in report and "bound at a = 0.66" in report
    assert "Instella-3B train step (" in report and "0.000B" not in report  # toy sizes read as K/M, not 0.000B
    assert "finetune-lora-1gpu.yaml" in report


def test_bench_speculative_smoke_trains_and_decodes(tmp_path, capsys):
    assert bench_speculative.main(["--smoke", "--workdir", str(tmp_path)]) == 0
    report = capsys.readouterr().out
    assert "| target |" in report and "| draft_32x1 |" in report
    row = next(line for line in report.splitlines() if line.startswith("| draft_32x1 (") and " | 2 | " in line)
    assert row.rstrip().endswith("2/2 |")  # greedy output identical with and without the draft, both prompts
    assert "x (v " in row  # the bound recomputed with the measured verification / step cost
    assert "Target shapes at random init" in report and "32 x 4: a step" in report
    # a kept step that is not what was asked (here: another width) is refused before any decoding, not reused
    config = json.loads((tmp_path / "target" / "config.json").read_text())
    (tmp_path / "target" / "config.json").write_text(json.dumps(config | {"hidden_size": 48}))
    with pytest.raises(SystemExit, match="holds a target of size"):
        bench_speculative.main(["--smoke", "--workdir", str(tmp_path)])


def test_stdlib_corpus_is_real_python():
    texts = bench_speculative.stdlib_sources(limit_bytes=50_000)
    assert texts and all(compile(t, "<stdlib>", "exec") for t in texts)


def test_distillation_labels_are_the_targets_greedy_next_tokens():
    """Every label is the target's argmax at the position before it (the model's own loss shifts by one), so on the
    target-continued sequences the labels are the continuation itself, and on real windows they are what the
    target would have said, not the text."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, pad_token_id=0)  # fmt: skip
    target = LlamaForCausalLM(config).eval()
    windows = torch.randint(1, 50, (6, 12)).tolist()
    starts = [windows[0][:5], windows[3][:5]]
    data = bench_speculative.distillation_set(target, windows[:4], starts)
    sequences, labels = torch.tensor(data["input_ids"]), torch.tensor(data["labels"])
    assert sequences.shape == labels.shape == (6, 12)
    assert sequences[:4].tolist() == windows[:4] and sequences[4:, :5].tolist() == starts
    with torch.no_grad():
        argmax = target(sequences).logits.argmax(-1)
    assert (labels[:, 0] == -100).all() and torch.equal(labels[:, 1:], argmax[:, :-1])
    assert torch.equal(labels[4:, 5:], sequences[4:, 5:])  # greedy continuation == the target's argmax labels


def test_docstring_starts_end_where_a_docstring_closes():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file="tests/fixtures/tokenizers/olmo-gpt-neox-20b-pii-special.json")
    module = (
        'import os\n\n\ndef first(path):\n    """Return the path\'s first part."""\n    return path[0]\n\n\n'
        'def undocumented():\n    return 1\n\n\nclass A:\n    def method(self, x):\n        """Twice x.\n\n'
        '        >>> A().method(2)\n        4\n        """\n        return 2 * x\n'
    )
    starts = bench_speculative.docstring_starts(tok, [module, "def broken(:\n"], prefix=6, n=2)
    assert len(starts) == 2 and all(len(s) == 6 for s in starts)  # the unparsable module is skipped
    texts = [tok.decode(s) for s in starts]
    assert texts[0].endswith('first part."""\n') and texts[1].endswith('        4\n        """\n')


def test_bench_token_files_smoke_reads_both_the_same_way(capsys):
    from benchmarks import bench_token_files

    args = ["--instances", "32", "--batches", "4", "--repeats", "1", "--workers", "0", "--no_record"]
    assert bench_token_files.main(args) == 0
    out = capsys.readouterr().out
    assert "workers 0: packed" in out and "29 instances in 7 token files vs 32 packed windows" in out
