"""scripts/sft.py from MDS folders (`mds_streams`, the long SFT's reader): prepare_data's `layout: mds` with
`label_mask_after` writes SFT-style rows (answers-only `label_mask`), a short run trains on them with the authors'
all-token loss (the answers' cross-entropy falls, the output folder is complete), 2 gloo processes with Ulysses SP 2
(streaming's `replication`: both ranks read one row) give the one-process losses on the exact path, and a run resumed
from its step-4 checkpoint trains steps 5-8 on the rows of the uninterrupted one. The rows against the authors'
collator and loss: tests/unit/post_training/test_sft_mds.py."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from instella_recipes.data import mds
from instella_recipes.data.prepare import PrepareArguments, prepare
from instella_recipes.post_training import sft

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("one_thread")


def _losses(folder) -> dict[int, float]:
    state = json.loads((Path(folder) / "trainer_state.json").read_text())
    return {h["step"]: h["loss"] for h in state["log_history"] if "loss" in h}


def _answer_ce(model_dir, rows) -> float:
    """Mean cross-entropy per target token (label_mask) of `rows`, documents kept apart as in training."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    batch = mds.MDSCollator(64, document_masking=True)(rows)
    with torch.no_grad():
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), batch["labels"][:, 1:].flatten(), ignore_index=-100))


@pytest.fixture(scope="module")
def sft_rows(tmp_path_factory, tiny_model_dir):
    """The tiny corpus as MDS rows of 64 tokens, targets only after 'Answer:', in the tiny model's tokenizer."""
    root = tmp_path_factory.mktemp("sft_mds_rows")
    args = PrepareArguments(output_dir=str(root), layout="mds", sources=[{"tiny_world": {}, "name": "qa"}],
                            tokenizer=str(tiny_model_dir), seq_len=64, seed=6198,
                            label_mask_after="Answer:")  # fmt: skip
    prepare(args)
    return root


def _argv(rows, model_dir, out, **overrides) -> list[str]:
    values = {"config": "recipes/tiny/sft_mds.yaml", "model_name_or_path": model_dir,
              "tokenizer_name_or_path": model_dir, "output_dir": out, "mds_streams": f"{rows}/qa@1.0",
              "max_length": 64, "max_steps": 8, "per_device_train_batch_size": 1, "gradient_accumulation_steps": 2,
              "global_batch_size": 2, "use_cpu": "true", "report_to": "none"}  # fmt: skip
    values.update(overrides)
    return [word for key, value in values.items() for word in (f"--{key}", str(value))]


@pytest.fixture(scope="module")
def one_process(sft_rows, tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft_mds_one") / "run"
    assert sft.main(_argv(sft_rows, tiny_model_dir, out, save_strategy="steps", save_steps=4)) == 0
    return out


def test_sft_style_rows_train_on_answers_and_the_run_is_complete(sft_rows, one_process, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    row = mds.import_streaming().LocalDataset(str(sft_rows / "qa"))[0]
    mask = row["label_mask"].astype(bool)
    assert 0 < mask.sum() < len(mask)
    answers = tokenizer.decode(row["input_ids"][mask])
    assert "The answer is" in answers and "Question" not in answers and "Answer:" not in answers

    losses = _losses(one_process)
    assert sorted(losses) == list(range(1, 9)) and all(np.isfinite(list(losses.values())))
    # a step's loss is its answers' summed CE over all 64 tokens, so it moves with each row's answer count: the
    # mean CE per answer token on the same rows, before and after, says whether it learned
    rows = [mds.import_streaming().LocalDataset(str(sft_rows / "qa"))[i] for i in range(16)]
    assert _answer_ce(one_process, rows) < 0.9 * _answer_ce(tiny_model_dir, rows)  # 6.23 -> 5.10 when written
    for name in ("manifest.json", "model.safetensors", "tokenizer.json", "data_report.json", "trainer_state.json"):
        assert (one_process / name).is_file(), name
    manifest = json.loads((one_process / "manifest.json").read_text())
    assert manifest["data"]["mds_streams"] == [f"{sft_rows}/qa@1.0"] and manifest["data"]["rows"] == 16


def test_a_resumed_run_trains_steps_5_to_8_as_the_uninterrupted_one(sft_rows, one_process, tiny_model_dir, tmp_path,
                                                                   capfd):  # fmt: skip
    """A fresh process rebuilds streaming's epoch 0 (SFTTrainer's first look does not start it) and the Trainer skips
    the trained batches: the resumed steps see the uninterrupted run's rows, so their losses are the same."""
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(one_process / "checkpoint-4", resumed / "checkpoint-4")
    shutil.copy(one_process / "run.json", resumed / "run.json")
    assert sft.main(_argv(sft_rows, tiny_model_dir, resumed, save_strategy="steps", save_steps=4)) == 0
    assert f"sft: resuming from {resumed / 'checkpoint-4'}" in capfd.readouterr().err
    one, again = _losses(one_process), _losses(resumed)
    for step in (5, 6, 7, 8):
        assert abs(one[step] - again[step]) < 1e-5, (step, one[step], again[step])


def test_two_process_sequence_parallel_gives_the_one_process_losses(sft_rows, one_process, tiny_model_dir,
                                                                    tmp_path):  # fmt: skip
    argv = _argv(sft_rows, tiny_model_dir, tmp_path / "sp2", sequence_parallel_size=2, sequence_parallel_mode="exact")
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT}", "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    result = subprocess.run([*launch, str(ROOT / "scripts/sft.py"), *argv], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    one, sp2 = _losses(one_process), _losses(tmp_path / "sp2")
    assert sorted(one) == sorted(sp2)
    for step in one:
        assert abs(one[step] - sp2[step]) < 1e-4, (step, one[step], sp2[step])
