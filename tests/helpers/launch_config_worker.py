"""Run under torchrun (tests only, gloo/CPU): one training stage through its entry point's `main(argv)` (the whole
lifecycle of `trainer/stage.py`: claim, train, final save, manifest) under one `accelerate_configs/*.yaml`, only the
device swapped, for tests/e2e/test_launch_configs.py.

`accelerate launch` turns an FSDP config into the accelerator state's FSDP plugin; on CPU accelerate refuses FSDP (its
AcceleratorState keeps MULTI_CPU), so this worker creates the shared state first and marks it FSDP with a plugin built
from the config's own `fsdp_config` (every key kept: version, resharding, wrap policy, `state_dict_type`, CPU-RAM
efficient loading, offload, activation checkpointing) and its `mixed_precision`, as tests/helpers/sft_fsdp_worker.py
does by hand; a `parallelism_config` (hybrid sharding) is kept with its replicate x shard layout scaled to the
processes here. DDP and MULTI_CPU configs need nothing: the Trainer runs DDP over gloo on CPU by itself.

    python -m torch.distributed.run --standalone --nproc_per_node N launch_config_worker.py CONFIG STAGE -- ARGV...
    python -m torch.distributed.run --standalone --nproc_per_node N launch_config_worker.py CONFIG --jobs JOBS.json
STAGE: pretrain | sft | dpo | grpo. ARGV: the stage's command line (the worker adds --bf16 for a bf16 config).
JOBS.json: a list of {stage, argv, env}: the stages run one after another in this one process group, each with its
`env` (the WORKER_* variables below) set, so the start-up (interpreters, imports, rendezvous) is paid once.

GRPO samples its rollouts, so no two process counts draw the same completions: with WORKER_FIXED_COMPLETIONS=N the
rollout still runs (transformers generation on the wrapped model, under FSDP on the sharded one) and its tokens are
then replaced by N tokens that depend only on the prompt and the sample's index in its group. Every process count then
scores and trains on the same completions, of one length, so the per-process token means average to the global one:
a 2-process run must equal the 1-process run (tests/e2e/test_launch_configs.py).
"""

import importlib
import json
import os
import sys
import zlib
from collections import Counter

import torch
import yaml
from accelerate import Accelerator, PartialState
from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

from instella_recipes.pretraining.fault_injection import kill_at_step

STAGES = {
    "pretrain": "instella_recipes.pretraining.pretrain",
    "sft": "instella_recipes.post_training.sft",
    "dpo": "instella_recipes.post_training.dpo",
    "grpo": "instella_recipes.post_training.grpo",
}
# accelerate config keys whose plugin argument is not the key without its `fsdp_` prefix
_PLUGIN_NAMES = {"fsdp_offload_params": "cpu_offload", "fsdp_version": "fsdp_version"}


def fsdp_plugin(fsdp_config: dict) -> FullyShardedDataParallelPlugin:
    """The plugin `accelerate launch` builds from a config's `fsdp_config` (keys as the config file writes them)."""
    kwargs = {_PLUGIN_NAMES.get(key, key.removeprefix("fsdp_")): value for key, value in fsdp_config.items()}
    kwargs["auto_wrap_policy"] = str(kwargs["auto_wrap_policy"]).lower()
    return FullyShardedDataParallelPlugin(**kwargs)


def parallelism(raw: dict, world_size: int):
    """A hybrid layout (replicate across nodes x shard inside one) on `world_size` processes: one 'node' here."""
    sizes = raw.get("parallelism_config")
    if not sizes:
        return None
    from accelerate.parallelism_config import ParallelismConfig

    return ParallelismConfig(dp_replicate_size=1, dp_shard_size=world_size, tp_size=1, cp_size=1)


def _precision(raw: dict) -> str:
    """The config's `mixed_precision`, unless the test asks for another (`WORKER_PRECISION=no`: fp32)."""
    return os.environ.get("WORKER_PRECISION") or str(raw.get("mixed_precision", "no"))


def apply_config(path: str) -> str:
    """Set up the accelerator state as `accelerate launch --config_file path` would, on CPU; returns its precision."""
    raw = yaml.safe_load(open(path))
    precision = _precision(raw)
    if raw["distributed_type"] != "FSDP":
        return precision
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    plugin = fsdp_plugin(raw["fsdp_config"])
    if precision == "bf16":
        plugin.set_mixed_precision("bf16")  # what AcceleratorState does with an FSDP plugin and bf16
    accelerator.state.fsdp_plugin = plugin
    accelerator.state.distributed_type = DistributedType.FSDP
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    return precision


def fix_completions(trainer_class) -> None:
    """While WORKER_FIXED_COMPLETIONS=N is set, replace each rollout's sampled tokens by N non-special tokens drawn
    from a generator seeded by (prompt, index of this prompt's sample in the batch): the same completions in every
    process layout (module docstring)."""
    sample = trainer_class._generate_single_turn

    def generate(self, prompt_ids, *args, **kwargs):
        sampled, logprobs = sample(self, prompt_ids, *args, **kwargs)  # the real rollout runs, then is replaced
        if not os.environ.get("WORKER_FIXED_COMPLETIONS"):
            return sampled, logprobs
        length = int(os.environ["WORKER_FIXED_COMPLETIONS"])
        assert len(sampled) == len(prompt_ids)
        self.sampled_lengths = getattr(self, "sampled_lengths", []) + [len(c) for c in sampled]
        special = set(self._tokenizer.all_special_ids)
        allowed = torch.tensor([i for i in range(len(self._tokenizer)) if i not in special])
        seen, completions = Counter(), []
        for ids in prompt_ids:
            key = tuple(ids)
            generator = torch.Generator().manual_seed(zlib.crc32(repr((key, seen[key])).encode()))
            seen[key] += 1
            completions.append(allowed[torch.randint(len(allowed), (length,), generator=generator)].tolist())
        return completions, None

    trainer_class._generate_single_turn = generate


_RUN_STAGE = {}  # each stage module's own run_stage, before run_job wraps it


def run_job(config: str, stage: str, argv: list[str]) -> int:
    """Run the stage's `main(argv)`; the config is applied once the settings are parsed (transformers'
    `TrainingArguments` set up their own device state while parsing), as the lifecycle starts."""
    bf16 = _precision(yaml.safe_load(open(config))) == "bf16"
    argv = [*argv, "--use_cpu", "true", "--bf16", "true" if bf16 else "false"]
    module = importlib.import_module(STAGES[stage])
    if stage not in _RUN_STAGE:
        _RUN_STAGE[stage] = module.run_stage
        if stage == "grpo":
            fix_completions(module.InstellaGRPOTrainer)
    run_stage = _RUN_STAGE[stage]

    def configured_run_stage(stage, *args, **kwargs):
        apply_config(config)
        # the Trainer hands its arguments' parallelism_config to its Accelerator, as `accelerate launch` with a
        # `parallelism_config` section does through the environment
        stage.args.parallelism_config = parallelism(yaml.safe_load(open(config)), int(os.environ.get("WORLD_SIZE", 1)))
        built = []
        build_trainer = stage.build_trainer

        def recorded_build_trainer(*a, **k):
            built.append(build_trainer(*a, **k))
            if os.environ.get("RANK", "0") == os.environ.get("WORKER_SHORT_ROLLOUT_RANK"):
                # this rank's rollouts all end after one token (as when each samples EOS at once) while the others'
                # go on: under FSDP each decoding step all-gathers the shards, so the ranks must keep stepping
                # together (generate's `synced_gpus`, on since torch's `fully_shard` marks the model) or they hang
                built[-1].generation_config.max_new_tokens = 1
            if os.environ.get("WORKER_KILL_STEP"):  # SIGTERM to rank 0 at the end of that step (a pre-emption),
                # ahead of the pre-emption callback, which then saves checkpoint-<that step> at the same step end
                killer = kill_at_step(None, {"kill_step": os.environ["WORKER_KILL_STEP"], "kill_signal": "TERM"})[0]
                built[-1].callback_handler.callbacks.insert(0, killer)
            return built[-1]

        stage.build_trainer = recorded_build_trainer
        code = run_stage(stage, *args, **kwargs)
        if built and os.environ.get("WORKER_RECORD"):  # what the trainer ran under, for the test to check
            plugin = getattr(built[0].accelerator.state, "fsdp_plugin", None)
            record = {
                "wrapped": type(built[0].model_wrapped).__name__,
                "distributed_type": str(built[0].accelerator.distributed_type),
                "state_dict_type": str(plugin.state_dict_type) if plugin is not None else None,
                "sampled_lengths": getattr(built[0], "sampled_lengths", None),  # GRPO: the real rollouts' lengths
            }
            rank = os.environ.get("RANK", "0")
            with open(f"{os.environ['WORKER_RECORD']}.rank{rank}.json", "w") as f:
                json.dump(record, f)
        return code

    module.run_stage = configured_run_stage
    return module.main(argv)


def main(config: str, *args: str) -> int:
    """One stage (`STAGE -- ARGV`) or several in turn (`--jobs JOBS.json`); the first failing one's exit code."""
    torch.set_num_threads(1)
    if args[0] != "--jobs":
        return run_job(config, args[0], list(args[2:] if args[1:2] == ("--",) else args[1:]))
    with open(args[1]) as f:
        jobs = json.load(f)
    for job in jobs:
        saved = dict(os.environ)
        os.environ.update(job.get("env", {}))
        try:
            code = run_job(config, job["stage"], job["argv"])
        finally:
            os.environ.clear()
            os.environ.update(saved)
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:]))
