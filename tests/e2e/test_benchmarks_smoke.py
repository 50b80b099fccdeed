"""The benchmark suites cannot rot: `make bench-gpu SMOKE=1` (benchmarks/bench_gpu.py --smoke) and the trained
speculative-decoding benchmark run every code path at toy size on CPU; the numbers they compute are checked against
hand computations (SPEC.md 6 MFU, the micro-batch search), not against themselves. The token-file check's benchmark
runs on a 10 MiB file."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import bench_gpu, bench_speculative, bench_token_check
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
    # packed documents: plain causal sdpa, then sdpa and flex with cu_seq_lens and with position_ids restarts
    docs = results["documents"]
    measured = [(r["attn"], r["documents"]) for r in docs if r.get("status") == "ok"]
    assert measured[:3] == [("sdpa", "none (plain causal)"), ("sdpa", "cu_seq_lens"), ("sdpa", "position_ids")]
    flex = {r["documents"] for r in docs if r["attn"] == "flex_attention"}  # measured on a GPU; on CPU the reason
    assert flex == {"cu_seq_lens", "position_ids"}
    assert any(r["attn"] == "flash_attention_2" for r in docs)  # measured, or the reason it was not
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
    assert "at long context on one GPU" in report and "### Packed documents: 4 x 16 tokens" in report
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


def test_bench_token_check_runs_and_extrapolates(capsys):
    """benchmarks/bench_token_check.py on a 10 MiB file, not recorded: every row of its table is there."""
    assert bench_token_check.main(["--gib", "0.01", "--repeats", "1", "--no_record"]) == 0
    out = capsys.readouterr().out
    assert "stage 1 (2329 files)" in out and "assumed evenly spread (3.49 GB a file)" in out
    assert out.count("\n| ") == 8  # header, rule and six checks


# Runs each benchmark file as `python benchmarks/<file> --help` would (its folder first on sys.path, the repository
# root not on it), in one interpreter so torch is imported once.
AS_A_FILE = """
import runpy, sys
folder, failed = sys.argv[1], []
base = [p for p in sys.path if p not in ("", ".") and not p.rstrip("/").endswith(folder.rsplit("/", 1)[0])]
for script in sys.argv[2:]:
    sys.path[:] = [folder, *base]
    sys.argv = [f"{folder}/{script}", "--help"]
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        del sys.modules[name]
    try:
        runpy.run_path(f"{folder}/{script}", run_name="__main__")
    except SystemExit as done:
        if done.code not in (0, None):
            failed.append(f"{script}: exit {done.code}")
    except BaseException as err:
        failed.append(f"{script}: {type(err).__name__}: {err}")
print("FAILED:", failed)
"""


def test_every_benchmark_runs_as_documented():
    """Issue 32: `python benchmarks/<bench>.py` as RESULTS.md and the docs write it (a file, the repository root not
    on the path) reaches `--help`: five failed with `ModuleNotFoundError: benchmarks`."""
    root = Path(__file__).resolve().parents[2]
    scripts = sorted(p.name for p in (root / "benchmarks").glob("bench_*.py"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root / "src")  # the installed package, as after `pip install -e .`; not the root
    done = subprocess.run([sys.executable, "-c", AS_A_FILE, str(root / "benchmarks"), *scripts], cwd="/",
                          env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0 and "FAILED: []" in done.stdout, (done.stdout[-3000:], done.stderr[-2000:])
    assert done.stdout.count("usage:") == len(scripts) >= 11


def test_bench_dolma_tokens_names_a_requirements_file_that_exists():
    from benchmarks import bench_dolma_tokens

    source = Path(bench_dolma_tokens.__file__).read_text()
    named = re.findall(r'ROOT / "tests" / "helpers" / "(\w+\.txt)"', source)
    assert named and all((bench_dolma_tokens.ROOT / "tests" / "helpers" / n).is_file() for n in named)
