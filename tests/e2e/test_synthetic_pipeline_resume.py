"""The end-to-end half of tests/unit/synthetic_gsm8k/test_synthetic_pipeline.py
(processes, whole runs, oracles); the in-process tests are there.

Synthetic GSM8K end to end on the shipped seed problems: a scripted backend with known-good and known-bad replies
(acceptance logic checked count by count), a real OpenAI-compatible HTTP server on 127.0.0.1, resume after SIGKILL,
and the entry point's input checks."""

import json
import os
import signal
import subprocess
import sys
import time

from instella_recipes.synthetic_gsm8k.run import SyntheticGSM8KArguments, run
from tests.helpers.synthetic_fakes import ROOT, SEEDS, OracleServer
from tests.unit.synthetic_gsm8k import test_synthetic_pipeline as unit_half  # fixtures and helpers both halves use

SMALL, _journal_lines, needs_bwrap = unit_half.SMALL, unit_half._journal_lines, unit_half.needs_bwrap


@needs_bwrap
def test_resume_after_sigkill_gives_the_same_dataset(tmp_path):
    with OracleServer(delay=0.01) as server:
        common = dict(seeds=str(SEEDS), base_url=server.url, model="oracle", max_concurrency=2, chunk_size=2, **SMALL)
        reference = tmp_path / "reference"
        run(SyntheticGSM8KArguments(output_dir=str(reference), **common))
        reference_requests = len(server.log)

        resumed = tmp_path / "resumed"
        script = (
            "import json, sys\nfrom instella_recipes.synthetic_gsm8k.run import SyntheticGSM8KArguments, run\n"
            "run(SyntheticGSM8KArguments(**json.loads(sys.argv[1])))\n"
        )
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen(
            [sys.executable, "-c", script, json.dumps({**common, "output_dir": str(resumed)})],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while _journal_lines(resumed / "journal") < 12 and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
        child.wait()
        assert child.returncode == -signal.SIGKILL, "the run finished before it could be killed"
        assert not (resumed / "train.parquet").exists() and not (resumed / "manifest.json").exists()
        killed_at = _journal_lines(resumed / "journal")
        requests_before = len(server.log)
        run(SyntheticGSM8KArguments(output_dir=str(resumed), **common))
        resumed_requests = len(server.log) - requests_before
    assert (resumed / "train.parquet").read_bytes() == (reference / "train.parquet").read_bytes()
    assert json.loads((resumed / "summary.json").read_text()) == json.loads((reference / "summary.json").read_text())
    # Nothing finished was redone: the journals hold each step once, and the resumed run asked for less.
    for path in (resumed / "journal").glob("*.jsonl"):
        events = [json.loads(line) for line in path.read_text().splitlines()]
        keys = [(e["event"], e.get("round")) for e in events]
        assert len(keys) == len(set(keys)), f"{path.name} repeats a step"
    assert killed_at > 0 and resumed_requests < reference_requests
