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

GRPO (the Instella-Math stages' configs) samples its rollouts, so the worker's WORKER_FIXED_COMPLETIONS replaces the
sampled tokens (after a real rollout on the sharded model) by ones that depend only on the prompt: the 2-process run
then equals the 1-process run in its weights and in every step's logged loss, grad norm, reward and KL.

Lean by design: the tiny model, 2 optimizer steps, 8 rows. Configs that the worker turns into the same run on 2 CPU
processes (the full-shard ones differ only in machine and process counts, which the test replaces; DDP on 8 GPUs and
on 2 CPUs is the same gloo DDP; single_gpu is the 1-process reference itself) share their runs, each still checked as
its own case; all stages of one such run key are one launch (the worker's `--jobs`: start-up paid once), the
1-process references one more; the SIGTERM tests compare with the matrix's own 2-step run."""

import json
import math
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
GRPO_LENGTH = 8  # tokens per (fixed) GRPO completion = max_completion_length
METRICS = ("loss", "grad_norm", "reward", "kl", "entropy")  # what GRPO logs per step and the tests compare


def _stage_of(recipe: Path, script: str | None = None) -> tuple[str, bool]:
    name = Path(script).stem if script else recipe.stem.split("-")[0].split("_")[0]
    stage = {"finetune": "sft", "pretrain": "pretrain", "sft": "sft", "dpo": "dpo", "grpo": "grpo"}[name]
    return stage, "lora" in recipe.stem


def matrix() -> list[tuple[str, str, bool]]:
    """(config stem, stage, LoRA) for every config and every recipe that names it."""
    cells = set()
    for recipe in sorted(ROOT.glob("recipes/*/*.yaml")):
        text = recipe.read_text()
        if recipe.name == "pipeline.yaml":
            for stage in yaml.safe_load(text).get("stages", []):
                if stage.get("accelerate_config"):
                    kind = _stage_of(ROOT / stage["recipe"], stage["command"])
                    cells.add((Path(stage["accelerate_config"]).stem, *kind))
            continue
        for config in CONFIGS:
            if config.name in text:
                cells.add((config.stem, *_stage_of(recipe)))
    for config in CONFIGS:
        if not any(cell[0] == config.stem for cell in cells):
            cells.add((config.stem, UNNAMED_STAGE, False))
    return sorted(cells)


def _raw(config: str) -> dict:
    return yaml.safe_load((ROOT / "accelerate_configs" / f"{config}.yaml").read_text())


def _world(config: str) -> int:
    return 1 if _raw(config)["num_processes"] == 1 else 2


def _as_run(config: str) -> str:
    """What the worker makes of the config on this machine (tests/helpers/launch_config_worker.py): the process
    count, and for FSDP its `fsdp_config` and whether a `parallelism_config` is given; nothing else of the file is
    read (fp32 replaces `mixed_precision`, the launcher replaces machines and rendezvous). Equal strings = one run."""
    raw = _raw(config)
    run = {"world": _world(config), "distributed_type": "FSDP" if raw["distributed_type"] == "FSDP" else "DDP"}
    if run["distributed_type"] == "FSDP":
        run.update(fsdp=raw["fsdp_config"], hybrid=bool(raw.get("parallelism_config")))
    return json.dumps(run, sort_keys=True)


def _argv(stage: str, lora: bool, model_dir: Path, data_dir: Path, out: Path, world: int) -> list[str]:
    """The stage's tiny recipe, 2 steps of global batch 4 whatever the process count (LoRA without dropout: its
    masks come from each process's own random stream, so no two process counts could agree); GRPO: 2 prompts x 4
    completions of 8 tokens per step, a reward that varies within a group (digits' share)."""
    batch = 8 if stage == "grpo" else 4
    common = ["--output_dir", str(out), "--max_steps", str(STEPS), "--report_to", "none", "--save_strategy", "no",
              "--per_device_train_batch_size", str(batch // world), "--gradient_accumulation_steps", "1",
              "--global_batch_size", str(batch), "--logging_steps", "1", "--seed", "0"]  # fmt: skip
    if stage == "pretrain":
        from tests.helpers.pretrain_utils import TINY_MODEL

        return ["--data_dir", str(data_dir), "--model_config", json.dumps(TINY_MODEL), "--learning_rate", "3e-3",
                "--dataloader_drop_last", "true", *common]  # fmt: skip
    argv = ["--config", str(ROOT / "recipes" / "tiny" / f"{stage}.yaml"), "--model_name_or_path", str(model_dir),
            "--max_samples", "8", "--warmup_steps", "0", "--learning_rate", "1e-2" if lora else "3e-3",
            *common]  # fmt: skip
    if stage == "grpo":
        argv += ["--num_generations", "4", "--max_completion_length", str(GRPO_LENGTH),
                 "--reward_funcs", "tests.helpers.grpo_rewards.digit_share"]  # fmt: skip
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


def _job_env(stage: str, record: Path, **env) -> dict[str, str]:
    """The worker's variables for one stage: GRPO's the same completions in every layout, rank 0's real rollouts
    ending first (tests/helpers/launch_config_worker.py)."""
    grpo = {"WORKER_FIXED_COMPLETIONS": str(GRPO_LENGTH), "WORKER_SHORT_ROLLOUT_RANK": "0"} if stage == "grpo" else {}
    return {**grpo, "WORKER_RECORD": str(record), **env}


def _launch(config: str, world: int, args: list[str], **env) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT / "src"), str(ROOT)])  # this clone's package, not an installed copy
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               WORKER_PRECISION="no", **env)  # fmt: skip
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world),
               str(WORKER), str(ROOT / "accelerate_configs" / f"{config}.yaml"), *args]  # fmt: skip
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def run_worker(
    config: str, stage: str, argv: list[str], world: int, record: Path, **env
) -> subprocess.CompletedProcess:
    """One stage in one launch."""
    return _launch(config, world, [stage, "--", *argv], **_job_env(stage, record, **env))


def _launches() -> dict[str, dict[tuple[str, bool], str]]:
    """Run key (`_as_run`) -> {(stage, LoRA): the config whose case asked for it}: every matrix case, and on
    single_gpu (the 1-process reference) every (stage, LoRA) of the matrix."""
    groups = {}
    for config, stage, lora in matrix():
        groups.setdefault(_as_run(config), {}).setdefault((stage, lora), config)
    reference = groups.setdefault(_as_run("single_gpu"), {})
    for _, stage, lora in matrix():
        reference.setdefault((stage, lora), "single_gpu")
    return groups


@pytest.fixture(scope="module")
def pretrain_data(tmp_path_factory):
    from tests.helpers.pretrain_utils import prepare_tiny

    folder = tmp_path_factory.mktemp("launch_data")
    prepare_tiny(folder)
    return folder


@pytest.fixture(scope="module")
def runs(tiny_model_dir, pretrain_data, tmp_path_factory):
    """`runs(config, stage, lora)` -> the output folder of that run (its worker record beside it, `_record`); all
    stages of one distinct run key (`_as_run`) are made in one launch, the first time one is asked for:
    `runs("single_gpu", ...)` is the 1-process reference."""
    made = {}

    def run(config: str, stage: str, lora: bool) -> Path:
        key = _as_run(config)
        if key not in made:
            folder, world = tmp_path_factory.mktemp(f"{config}_run"), _world(config)
            outs, jobs = {}, []
            for stage_, lora_ in _launches()[key]:
                out = outs[(stage_, lora_)] = folder / f"{stage_}{'-lora' if lora_ else ''}"
                argv = _argv(stage_, lora_, tiny_model_dir, pretrain_data, out, world)
                jobs.append({"stage": stage_, "argv": argv, "env": _job_env(stage_, Path(f"{out}.record"))})
            (folder / "jobs.json").write_text(json.dumps(jobs))
            done = _launch(config, world, ["--jobs", str(folder / "jobs.json")])
            assert done.returncode == 0, done.stderr[-3000:]
            made[key] = outs
        return made[key][(stage, lora)]

    return run


def _record(out: Path, rank: int = 0) -> dict:
    return json.loads(Path(f"{out}.record.rank{rank}.json").read_text())


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


def _logged(out: Path) -> list[dict]:
    """The per-step log entries (step + METRICS) of a GRPO run's trainer_state.json."""
    state = json.loads((out / "trainer_state.json").read_text())
    return [{k: e[k] for k in ("step", *METRICS)} for e in state["log_history"] if "loss" in e]


def _check_grpo_logs(ours: Path, reference: Path) -> None:
    """Every step's loss, grad norm, reward, KL and entropy equal the 1-process run's (same completions; fp32 sums in
    another order), all finite, and the first step's groups had a spread (the loss had a gradient)."""
    mine, theirs = _logged(ours), _logged(reference)
    assert [e["step"] for e in mine] == [e["step"] for e in theirs] == list(range(1, STEPS + 1))
    for a, b in zip(mine, theirs, strict=True):
        for key in METRICS:
            assert math.isfinite(a[key]) and a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (key, a, b)
    state = json.loads((reference / "trainer_state.json").read_text())
    assert state["log_history"][0]["frac_reward_zero_std"] < 1


@pytest.mark.parametrize(("config", "stage", "lora"), matrix(), ids=lambda v: str(v) if not isinstance(v, bool) else ("lora" if v else "full"))  # fmt: skip # noqa: E501
def test_every_launch_config_ends_with_a_model(config, stage, lora, tiny_model_dir, runs):
    raw = _raw(config)
    world = _world(config)
    out = runs(config, stage, lora)
    record = _record(out)
    if raw["distributed_type"] == "FSDP":  # sharded by FSDP2, the config's sharded checkpoints kept
        assert record["wrapped"].startswith("FSDP") and record["state_dict_type"].endswith(
            raw["fsdp_config"]["fsdp_state_dict_type"]
        )
    elif world == 2:
        assert record["wrapped"] == "DistributedDataParallel"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["global_step"] == STEPS and manifest["world_size"] == world
    _check_saved_pretrained_only(out, lora)

    reference = runs("single_gpu", stage, lora)
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
    if stage == "grpo":
        _check_grpo_logs(out, reference)
        if world == 2:  # the real rollouts ran on the sharded model, rank 0's ending 7 tokens before rank 1's
            lengths = [_record(out, rank)["sampled_lengths"] for rank in (0, 1)]
            assert set(lengths[0]) == {1} and set(lengths[1]) == {GRPO_LENGTH}, lengths


@pytest.mark.parametrize(("config", "stage"), [("fsdp2_full_shard_16x8_mi300x", "sft"), ("fsdp2_full_shard_2x8_mi300x", "grpo")])  # fmt: skip # noqa: E501
def test_sigterm_under_fsdp_resumes_bit_exact(config, stage, tiny_model_dir, pretrain_data, runs, tmp_path):
    """The stage under a shipped FSDP2 config (SFT: the published SFT layout; GRPO: GRPO-1's), with a SIGTERM at the
    end of step 1 of 2 (every rank saves a sharded DCP checkpoint-1 and exits 0), then the same command again (resume
    `auto`): the same bytes as the matrix's straight 2-step run of that config."""
    world = 2
    resumed = tmp_path / "resumed"
    argv = _argv(stage, False, tiny_model_dir, pretrain_data, resumed, world)
    done = run_worker(config, stage, argv, world, tmp_path / "a", WORKER_KILL_STEP="1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "pre-empted; saved checkpoint-1" in done.stdout + done.stderr and not (resumed / "manifest.json").exists()
    assert (resumed / "checkpoint-1" / "pytorch_model_fsdp_0").is_dir()  # sharded (DCP), as the config says
    done = run_worker(config, stage, argv, world, tmp_path / "b")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stdout + done.stderr
    assert json.loads((resumed / "manifest.json").read_text())["global_step"] == STEPS
    straight = runs(config, stage, False)
    a, b = load_file(straight / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    if stage == "grpo":  # step 1 logged before the SIGTERM (kept in the checkpoint), step 2 after the resume
        assert _logged(resumed) == _logged(straight)
