"""Ulysses sequence parallelism (trainer/features/sequence_parallel.py) on 2 and 4 gloo processes against one process
and against the authors' split, computed by their `get_sequence_parallel_inputs`
(tests/helpers/instella_long_oracle.py, copied from AMD-AIG-AIMA/Instella instella-long 560ebe7). The worker
(tests/helpers/sp_worker.py) runs a float64 tiny Instella on one packed row; see its docstring for the cases."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("processes", [2, 4])
def test_ulysses_matches_one_process_and_the_authors_split(tmp_path, processes):
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(processes),
               str(ROOT / "tests/helpers/sp_worker.py"), str(tmp_path)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in range(processes):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        exact = out["exact"]  # logits gathered, loss and gradients summed over the ranks
        assert not exact["local"] and exact["logits"] < 1e-5 and exact["grad"] < 1e-5 and exact["loss"] < 1e-5
        for case in ("authors_fallback", "authors_long_doc", "authors_forced"):
            assert out[case]["same_path"], (case, rank)  # the fallback exactly where the authors take it
            assert out[case]["logits"] < 1e-5 and out[case]["loss"] < 1e-5, (case, rank, out[case])
        assert out["authors_fallback"]["local"] and not out["authors_long_doc"]["local"]
        assert not out["authors_forced"]["local"] and out["authors_forced"]["from_exact"] < 1e-5
        assert out["authors_long_doc"]["from_exact"] < 1e-5
    # the fallback is an approximation: a document cut at a chunk border loses attention to its first half
    assert max(json.loads((tmp_path / f"rank{r}.json").read_text())["authors_fallback"]["from_exact"]
               for r in range(processes)) > 1e-3  # fmt: skip
