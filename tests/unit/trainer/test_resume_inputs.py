"""Resume only on the same inputs (trainer/stage.py `identity`, `check_run_dir`): the identity of an SFT, DPO or
GRPO run covers the contents of its local `sources` files, so a file rewritten in place (same size, other rows)
after a checkpoint refuses the resume with one line naming the file; unchanged files resume."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.post_training import dpo, grpo, sft
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.trainer.stage import check_run_dir, claim_run_dir

ROOT = Path(__file__).resolve().parents[3]
STAGES = {
    "sft": (sft.CheckedSFTConfig, sft.SFTStage, '{"messages": [{"role": "user", "content": "1 + 1"}]}'),
    "dpo": (dpo.CheckedDPOConfig, dpo.DPOStage, '{"prompt": "1 + 1", "chosen": "2", "rejected": "3"}'),
    "grpo": (grpo.CheckedGRPOConfig, grpo.GRPOStage, '{"prompt": "1 + 1", "answer": "2"}'),
}


def _identity(name, data_file, out):
    settings, stage, _ = STAGES[name]
    argv = ["--config", str(ROOT / "recipes" / "tiny" / f"{name}.yaml"), "--output_dir", str(out),
            "--use_cpu", "true", "--sources", f"{{path: {data_file}}}"]  # fmt: skip
    args, model_args = parse_recipe([settings, CheckedModelConfig], argv)
    return stage(args, model_args, argv).identity(None)


@pytest.mark.parametrize("name", STAGES)
def test_a_source_file_rewritten_in_place_refuses_the_resume_naming_it(name, tmp_path):
    data_file, out = tmp_path / "data.jsonl", tmp_path / "out"
    row = STAGES[name][2]
    data_file.write_text(row + "\n")
    identity = _identity(name, data_file, out)
    claim_run_dir(out, identity, False, [])
    (out / "checkpoint-2").mkdir()
    (out / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    assert check_run_dir(name, out, _identity(name, data_file, out)) is None  # the same file: resumes
    data_file.write_text(row.replace("1 + 1", "1 + 2") + "\n")  # same size, other content
    with pytest.raises(RecipeError) as info:
        check_run_dir(name, out, _identity(name, data_file, out))
    said = str(info.value)
    assert "changed: data_content" in said and "\n" not in said
    assert f"sources file {data_file} has other contents than when the checkpoints were written" in said


def test_sft_from_mds_names_its_shards_and_a_pretrain_without_sources_has_no_content_key(tmp_path):
    settings, stage, _ = STAGES["sft"]
    argv = ["--config", str(ROOT / "recipes" / "tiny" / "sft.yaml"), "--output_dir", str(tmp_path / "out"),
            "--use_cpu", "true"]  # fmt: skip
    args, model_args = parse_recipe([settings, CheckedModelConfig], argv)
    shards = [["/data/long/shard.00000.mds", 100, "ab", "mds_streams shard"]]
    data = SimpleNamespace(report={"data_fingerprint": "f" * 64, "data_files": shards})
    identity = stage(args, model_args, argv).identity(data)
    assert identity["data_fingerprint"] == "f" * 64 and identity["data_files"] == shards
    assert "data_content" not in identity and "sources" not in identity  # the fingerprint stands for the data
    plain = stage(args, model_args, argv).identity(None)  # the recipe's tiny_world source: no file, no content key
    assert "data_content" not in plain and plain["sources"]
