"""The end-to-end half of tests/unit/evaluation/test_eval_suites.py
(processes, whole runs, oracles); the in-process tests are there.

The lm-eval suites: generated files up to date, offline tasks = upstream logic + shipped data, the real `lm_eval`
CLI on a tiny trust_remote_code checkpoint from another cwd, metric wiring proven with an oracle LM, the report, and
the checks before model work."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from instella_recipes.evaluation import report
from instella_recipes.evaluation import tasks as make_tasks
from tests.unit.evaluation import test_eval_suites as unit_half  # fixtures and helpers both halves use

ROOT, TASKS = unit_half.ROOT, unit_half.TASKS


# --- the real CLI ------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_lm_eval_cli_runs_offline_suites_from_any_cwd_and_the_report_renders_them(tiny_model_dir, tmp_path):
    lm_eval = shutil.which("lm_eval", path=str(Path(sys.executable).parent)) or "lm_eval"
    cwd = tmp_path / "elsewhere"  # data_files must not depend on the current directory
    cwd.mkdir()
    out = tmp_path / "results"
    cmd = [
        lm_eval, "--model", "hf", "--model_args", f"pretrained={tiny_model_dir},trust_remote_code=True",
        "--include_path", str(TASKS), "--tasks", "tiny_world,amd_llama_135m_offline,olmes_hellaswag__olmo1_offline",
        "--limit", "1",
        "--output_path", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result_file = report.find_result_file(out)
    results = json.loads(result_file.read_text())["results"]
    expected = {m.offline_task for m in make_tasks.SUITES["amd_llama_135m"]}
    expected |= {"tiny_world_mc", "tiny_world_arithmetic"}
    assert expected <= set(results)
    assert results["tiny_world_mc"]["acc,none"] in (0.0, 1.0)
    # the offline suite's group row is its suite score: lm-eval's unweighted mean of the members' acc
    members = [results[m.offline_task]["acc,none"] for m in make_tasks.SUITES["amd_llama_135m"]]
    assert results["amd_llama_135m_offline"]["acc,none"] == pytest.approx(sum(members) / len(members))
    # an OLMES task through the CLI: acc_per_token counts tokens with the tokenizer of --model_args pretrained=
    assert results["olmes_hellaswag__olmo1_offline"]["acc_per_token,none"] in (0.0, 1.0)

    table, png = report.write_report("amd_llama_135m", [out], tmp_path / "report", names=["tiny"])
    text = table.read_text()
    assert "| tiny (offline sample items) |" in text and "| AMD-Llama-135m | 0.3977 |" in text
    assert png.stat().st_size > 5000 and png.read_bytes()[:4] == b"\x89PNG"
    table, png = report.write_report("tiny_world", [out], tmp_path / "report")
    assert "tiny_world_arithmetic" in table.read_text() and png.stat().st_size > 0
