"""Instella-Math parts as whole runs on a tiny checkpoint: an SFT-2-shaped run through `scripts/sft.py` (AM rows, the
English-only rule, open-instruct rows, summed loss) that finishes with its manifest, and the `lm_eval` CLI running an
Instella-Math task with 16 samples per problem (pass@1 a multiple of 1/16, every sample logged)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY_SFT = ROOT / "recipes" / "tiny" / "sft.yaml"


def _env() -> dict:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")


def _am_rows(n: int) -> list[dict]:
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + {i}? Answer with a number."},
                      {"role": "assistant", "content": f"<think>\nDouble {i}.\n</think>\n\\boxed{{{2 * i}}}"}]}
        for i in range(n)
    ]  # fmt: skip
    rows.append({"messages": [{"role": "user", "content": "计算二加二等于几？请给出答案。"}, rows[0]["messages"][1]]})
    return rows


@pytest.mark.slow
def test_sft_stage2_shaped_run_finishes_with_its_manifest(tiny_model_dir, tmp_path):
    data = tmp_path / "am.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in _am_rows(16)))
    out = tmp_path / "sft2"
    env = _env()
    cmd = [
        sys.executable, str(ROOT / "scripts" / "sft.py"), "--config", str(TINY_SFT),
        "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
        "--sources", f"{{path: {data}, converter: am_deepseek_r1_distilled}}",
        "--row_format", "open_instruct", "--loss_reduction", "sum", "--average_tokens_across_devices", "false",
        "--global_batch_size", "4", "--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "2",
        "--max_steps", "2", "--logging_steps", "1", "--report_to", "none", "--use_cpu", "true",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "sft" and manifest["global_step"] == 2
    report = json.loads((out / "data_report.json").read_text())
    assert report["sources"][0]["rows"] == 16  # the Chinese row is not English: dropped before conversion
    losses = [entry["loss"] for entry in json.loads((out / "trainer_state.json").read_text())["log_history"]
              if "loss" in entry]  # fmt: skip
    # summed token CE / 2 micro-batches: tens of label tokens x ~ln(512) each; a per-token mean would be about 6.2
    assert losses and all(loss > 60 for loss in losses), losses


@pytest.mark.slow
def test_lm_eval_cli_runs_an_instella_math_task_with_16_samples(tiny_model_dir, tmp_path):
    lm_eval = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or "lm_eval"
    out = tmp_path / "results"
    cmd = [
        lm_eval, "--model", "hf", "--model_args", f"pretrained={tiny_model_dir},trust_remote_code=True",
        "--include_path", str(ROOT / "eval" / "tasks"), "--tasks", "instella_math_gsm8k_offline", "--limit", "2",
        "--gen_kwargs", "max_gen_toks=8", "--log_samples", "--output_path", str(out), "--seed", "0",
    ]  # fmt: skip
    env = _env()
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(out.rglob("results_*.json")).read_text())["results"]["instella_math_gsm8k_offline"]
    assert 0.0 <= result["pass@1,all_samples"] <= 1.0 and (result["pass@1,all_samples"] * 32) % 1 == 0
    samples = [json.loads(line) for line in next(out.rglob("samples_*.jsonl")).read_text().splitlines()]
    assert len(samples) == 2 and all(len(s["filtered_resps"][0]) == 16 for s in samples)
