"""SFT under FSDP reduces gradients in fp32, as the authors (`configs/instella-3b-sft.yaml` `fsdp.precision: mixed`
-> `instella/config.py` `fsdp_precision`: param bf16, reduce fp32). Checked on 2 gloo/CPU processes through the real
SFT trainer wrapped by accelerate's FSDP2: every all-gather moves bf16 parameters, every reduce-scatter fp32
gradients; with accelerate's own bf16 policy (the control) the reduce-scatter is bf16."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    path = tmp_path_factory.mktemp("fsdp_data") / "chats.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + 3?"}, {"role": "assistant", "content": f"{i + 3}."}]}
        for i in range(4)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _run(model_dir, data, out: Path, policy: str) -> list[dict]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        str(ROOT / "tests/helpers/sft_fsdp_worker.py"), str(model_dir), str(data), str(out), policy,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize(
    ("policy", "reduce_dtype"), [("recipe", "torch.float32"), ("accelerate", "torch.bfloat16")]
)  # fmt: skip
def test_sft_gradients_are_reduced_in_fp32_under_fsdp(tiny_model_dir, chats, tmp_path, policy, reduce_dtype):
    for record in _run(tiny_model_dir, chats, tmp_path, policy):
        assert record["wrapped"].startswith("FSDP")  # accelerate's fully_shard wrapped the SFT model
        assert record["all_gather"] == ["torch.bfloat16"]  # compute in bf16 (the authors' param_dtype)
        assert record["reduce_scatter"] == [reduce_dtype]
        assert f"reduce_dtype={reduce_dtype}" in record["policy"]
