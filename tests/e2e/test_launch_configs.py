"""Every shipped launch config ends with a model: each `accelerate_configs/*.yaml` x each recipe that names it (a
pipeline stage's `accelerate_config`, a recipe's launch comment; a config no recipe names runs pretraining, the stage
its docs name it for) runs its stage through the entry point's `main` on 2 CPU processes (gloo) with the config's
FSDP/DDP settings kept and only the device swapped (tests/helpers/launch_config_worker.py). The output folder must
load through the AutoClass, equal the 1-process run's weights within tolerance, and hold nothing but what
`save_pretrained` writes beside the stage's own records. And a SIGTERM under FSDP (its SHARDED_STATE_DICT checkpoint)
resumes SFT bit-exact, as pretraining does.

The runs compute in fp32 (`WORKER_PRECISION=no`): bf16 on a CPU is autocast emulation, and under it the first Adam
steps of two runs differ by about the learning rate, more than the update itself (measured: SFT moved 1.7e-3, the
FSDP run differed from the 1-process run by 3.0e-3), so the comparison would prove nothing, not even that the
trained weights and not the initial ones were saved. Every FSDP/DDP setting of the config is kept; bf16 under FSDP
(its all-gather and reduce dtypes) is tests/e2e/test_exactness_sft_fsdp.py's.

Lean by design: the tiny model, 2 optimizer steps, 8 rows; one 1-process reference per (stage, LoRA, precision)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "accelerate_configs").glob("*.yaml"))
WORKER = ROOT / "tests" / "helpers" / "launch_config_worker.py"
UNNAMED_STAGE = "pretrain"  # docs/pretraining.md launches ddp_8gpu (and the Slurm tests cpu_2proc_srun) with it
# What a stage writes beside `save_pretrained`'s files (model + tokenizer): its records.
RECORDS = {"manifest.json", "run.json", "trainer_state.json", "training_args.bin", "data_report.json"}
STEPS = 2


# GRPO samples its rollouts: a 2-process run draws other completions than the 1-process reference, so its weights
# cannot be compared; its launches (grpo_stage*.yaml, the math pipeline) are left out of this matrix.
NOT_COMPARED = {"grpo"}


def _stage_of(recipe: Path, script: str | None = None) -> tuple[str, bool] | None:
    name = Path(script).stem if script else recipe.stem.split("-")[0].split("_")[0]
    if name in NOT_COMPARED:
        return None
    stage = {"finetune": "sft", "pretrain": "pretrain", "sft": "sft", "dpo": "dpo"}[name]
    return stage, "lora" in recipe.stem


def matrix() -> list[tuple[str, str, bool]]:
    """(config stem, stage, LoRA) for every config and every recipe that names it."""
    cells = set()
    for recipe in sorted(ROOT.glob("recipes/*/*.yaml")):
        text = recipe.read_text()
        if recipe.name == "pipeline.yaml":
            for stage in yaml.safe_load(text).get("stages", []):
                kind = _stage_of(ROOT / stage["recipe"], stage["command"]) if stage.get("accelerate_config") else None
                if kind:
                    cells.add((Path(stage["accelerate_config"]).stem, *kind))
            continue
        for config in CONFIGS:
            kind = _stage_of(recipe) if config.name in text else None
            if kind:
                cells.add((config.stem, *kind))
    for config in CONFIGS:
        if not any(cell[0] == config.stem for cell in cells):
            cells.add((config.stem, UNNAMED_STAGE, False))
    return sorted(cells)


def _raw(config: str) -> dict:
    return yaml.safe_load((ROOT / "accelerate_configs" / f"{config}.yaml").read_text())


def _argv(stage: str, lora: bool, model_dir: Path, data_dir: Path, out: Path, world: int) -> list[str]:
    """The stage's tiny recipe, 2 steps of global batch 4 whatever the process count (LoRA without dropout: its
    masks come from each process's own random stream, so no two process counts could agree)."""
    per_device = str(4 // world)
    common = ["--output_dir", str(out), "--max_steps", str(STEPS), "--report_to", "none", "--save_strategy", "no",
              "--per_device_train_batch_size", per_device, "--gradient_accumulation_steps", "1",
              "--global_batch_size", "4", "--logging_steps", "1", "--seed", "0"]  # fmt: skip
    if stage == "pretrain":
        from tests.helpers.pretrain_utils import TINY_MODEL

        return ["--data_dir", str(data_dir), "--model_config", json.dumps(TINY_MODEL), "--learning_rate", "3e-3",
                "--dataloader_drop_last", "true", *common]  # fmt: skip
    argv = ["--config", str(ROOT / "recipes" / "tiny" / f"{stage}.yaml"), "--model_name_or_path", str(model_dir),
            "--max_samples", "8", "--warmup_steps", "0", "--learning_rate", "1e-2" if lora else "3e-3",
            *common]  # fmt: skip
    if lora:
        argv += [
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_alpha",
            "8",
            "--lora_target_modules",
            "q_proj",
            "v_proj",
            "--lora_dropout",
            "0",
        ]
    return argv


def run_worker(
    config: str, stage: str, argv: list[str], world: int, record: Path, **env
) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this clone's package, not an installed copy
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               WORKER_RECORD=str(record), WORKER_PRECISION="no", **env)  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
               str(WORKER), str(ROOT / "accelerate_configs" / f"{config}.yaml"), stage, "--", *argv]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory):
    from tests.helpers.pretrain_utils import prepare_tiny

    folder = tmp_path_factory.mktemp("launch_data")
    prepare_tiny(folder)
    return folder


@pytest.fixture(scope="module")
def references(tiny_model_dir, pretrain_data, tmp_path_factory):
    """The 1-process run of (stage, LoRA), made once: single_gpu.yaml, which shards nothing."""
    made = {}

    def reference(stage: str, lora: bool) -> Path:
        key = (stage, lora)
        if key not in made:
            out = tmp_path_factory.mktemp("reference") / stage
            config = "single_gpu"
            argv = _argv(stage, lora, tiny_model_dir, pretrain_data, out, world=1)
            done = run_worker(config, stage, argv, 1, out.parent / "record")
            assert done.returncode == 0, done.stderr[-3000:]
            made[key] = out
        return made[key]

    return reference


def _files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "runs" not in p.parts}


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return {k: v.float() for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(f).items()}


def _check_saved_pretrained_only(out: Path, lora: bool) -> None:
    """The folder = a fresh `save_pretrained` of what loads from it (model + tokenizer) + the stage's records: no
    library source file copied as remote code, no auto_map naming a generated FSDP class."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)  # the AutoClass loads it
    fresh = out.parent / f"{out.name}_fresh"
    model.save_pretrained(fresh)
    AutoTokenizer.from_pretrained(out).save_pretrained(fresh)
    extra = {name for name in _files(out) if name.startswith("adapter/")} if lora else set()
    assert _files(out) - RECORDS - extra == _files(fresh)
    assert "FSDP" not in (out / "config.json").read_text()
    if lora:
        from peft import AutoPeftModelForCausalLM

        assert AutoPeftModelForCausalLM.from_pretrained(out / "adapter") is not None
        assert not [name for name in extra if name.endswith(".py")]


@pytest.mark.parametrize(("config", "stage", "lora"), matrix(), ids=lambda v: str(v) if not isinstance(v, bool) else ("lora" if v else "full"))  # fmt: skip # noqa: E501
def test_every_launch_config_ends_with_a_model(
    config, stage, lora, tiny_model_dir, pretrain_data, references, tmp_path
):
    raw = _raw(config)
    world = 1 if raw["num_processes"] == 1 else 2
    out = tmp_path / stage
    done = run_worker(config, stage, _argv(stage, lora, tiny_model_dir, pretrain_data, out, world), world,
                      tmp_path / "record")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "record.rank0.json").read_text())
    if raw["distributed_type"] == "FSDP":  # sharded by FSDP2, the config's sharded checkpoints kept
        assert record["wrapped"].startswith("FSDP") and record["state_dict_type"].endswith(
            raw["fsdp_config"]["fsdp_state_dict_type"]
        )
    elif world == 2:
        assert record["wrapped"] == "DistributedDataParallel"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["global_step"] == STEPS and manifest["world_size"] == world
    _check_saved_pretrained_only(out, lora)

    reference = references(stage, lora)
    assert _files(out) == _files(reference)
    ours, theirs = _weights(out), _weights(reference)
    initial = _weights(tiny_model_dir) if stage != "pretrain" else None
    assert ours.keys() == theirs.keys()
    differs = max((tensor - theirs[name]).abs().max().item() for name, tensor in ours.items())
    assert differs <= 1e-4, differs  # fp32: only the order of the sums differs (sharded reduce-scatter, DDP buckets)
    if initial is not None:  # the runs trained, by far more than they differ: the comparison is of trained weights
        moved = max((theirs[k] - initial[k]).abs().max().item() for k in initial)
        assert moved > 10 * differs, (moved, differs)
        print(f"weights: moved {moved:.3g}, differ from the 1-process run by {differs:.3g}")


def test_sft_sigterm_under_fsdp_resumes_bit_exact(tiny_model_dir, pretrain_data, tmp_path):
    """SFT under the shipped FSDP2 config: 4 steps straight, and 4 steps with a SIGTERM at the end of step 1 (every
    rank saves a sharded DCP checkpoint-2 and exits 0), then the same command again (resume `auto`): the same bytes."""
    config, world = "fsdp2_full_shard_16x8_mi300x", 2

    def argv(out):
        base = _argv("sft", False, tiny_model_dir, pretrain_data, out, world)
        return [*base, "--max_steps", "4"]

    straight = tmp_path / "straight"
    assert run_worker(config, "sft", argv(straight), world, tmp_path / "a").returncode == 0
    resumed = tmp_path / "resumed"
    done = run_worker(config, "sft", argv(resumed), world, tmp_path / "b", WORKER_KILL_STEP="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pre-empted; saved checkpoint-2" in done.stdout + done.stderr and not (resumed / "manifest.json").exists()
    assert (resumed / "checkpoint-2" / "pytorch_model_fsdp_0").is_dir()  # sharded (DCP), as the config says
    done = run_worker(config, "sft", argv(resumed), world, tmp_path / "c")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        "resuming from" in done.stdout + done.stderr
        and json.loads((resumed / "manifest.json").read_text())["global_step"] == 4
    )
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
