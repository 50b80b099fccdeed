"""Pretraining with the transformers Trainer: everything `scripts/pretrain.py` runs.

The data is either a prepare_data folder of packed windows (`data_dir`, the Trainer's seeded shuffle) or OLMo token
files (`data_paths`, read in the authors' order on every rank: `data/token_files.py`).

The model comes from `model_name_or_path` (continue from a checkpoint with a new schedule: stage 2)
or from `model_config` (from scratch). Every input check runs before the first step; see docs/pretraining.md.
`pretrain(script, train, argv)` is the whole run: checks, trainer, train, then the final model and manifest;
`main(argv)` parses the recipe (`PretrainArguments` + `CheckedTrainingArguments`) and calls it.
"""

import hashlib
import importlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, TrainingArguments, default_data_collator

from instella_recipes.core import (
    RecipeError,
    check_choice,
    check_output_dir,
    check_range,
    check_training_length,
    claim_output_dir,
    config_path,
    exit_on_recipe_error,
    file_digest,
    get_logger,
    naming_write_failures,
    parse_recipe,
    read_manifest,
    resolved_arguments,
    setup_logging,
    write_manifest,
)
from instella_recipes.core.checks import check_model_config
from instella_recipes.core.variables import fill_placeholders
from instella_recipes.data.integrity import require_verified
from instella_recipes.data.packing import PackedWindows
from instella_recipes.data.token_files import (
    OLMoOrderSampler,
    TokenFiles,
    describe_data_change,
    token_files_from_args,
)
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.trainer.callbacks import PreemptionCallback
from instella_recipes.trainer.checkpoints import STAGING, complete_checkpoints, resolve_resume
from instella_recipes.trainer.checks import (
    CheckedTrainingArguments,
    check_global_batch,
    check_tokenizer_fits,
    fit_accumulation,
)
from instella_recipes.trainer.optim import check_schedule_kwargs
from instella_recipes.training.model_factory import build_model
from instella_recipes.training.optimizer_state import OPTIMIZER_DIR, check_optimizer_state, save_optimizer_state
from instella_recipes.training.pretrain_trainer import NonFiniteCallback, PretrainTrainer

logger = get_logger(__name__)
STAGE = "pretrain"
RUN_FILE = "run.json"
# TrainingArguments that define a run (a different value in the same output_dir is a different run).
_RUN_KEYS = (
    "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "max_steps", "num_train_epochs",
    "weight_decay", "adam_beta1", "adam_beta2",
    "adam_epsilon", "max_grad_norm", "seed", "data_seed", "optim",
)  # fmt: skip
# What the summed token cross-entropy is divided by (PretrainTrainer): every input token of the batch (OLMo's
# `train_step`: `batch['input_ids'].numel()`, instella/train.py:707) or the predicted ones (transformers' and lit_gpt's
# mean).
LOSS_NORMALIZERS = ("input_tokens", "predicted_tokens")


@dataclass
class PretrainArguments:
    """Recipe fields of `scripts/pretrain.py` beside transformers' `TrainingArguments`."""

    data_dir: str = field(default=None, metadata={"help": "Output folder of scripts/prepare_data.py."})
    data_paths: list[str] | None = field(
        default=None,
        metadata={"help": "Instead of data_dir: OLMo token files (flat uint16), or one .txt with a path a line."},
    )
    data_root: str | None = field(
        default=None, metadata={"help": "Folder that relative data_paths entries are joined to (default: cwd)."}
    )
    seq_len: int | None = field(default=None, metadata={"help": "data_paths: tokens per instance (Instella 4096)."})
    model_name_or_path: str | None = field(default=None, metadata={"help": "Continue from this checkpoint."})
    model_config: dict | str | None = field(
        default=None, metadata={"help": "From scratch: {model_type: instella|llama|zaya|olmoe, <config fields>}."}
    )
    init: str | None = field(default=None, metadata={"help": "mitchell (Instella), amd_llama, default."})
    tokenizer: str | None = field(default=None, metadata={"help": "Default: the tokenizer saved with the data."})
    global_batch_size: int | None = field(default=None, metadata={"help": "Published global batch (sequences)."})
    fit_global_batch: bool = field(
        default=False,
        metadata={
            "help": "Set gradient_accumulation_steps = global_batch_size / (per_device_train_batch_size x world "
            "size) at start: a job that restarts on fewer or more nodes (sbatch --nodes=12-16) keeps the global batch."
        },
    )
    document_masking: bool = field(default=False, metadata={"help": "position_ids restart after each EOS."})
    predict_all_positions: bool = field(
        default=False,
        metadata={"help": "Windows of seq_len + 1 tokens, all seq_len inputs predicted (lit_gpt: AMD-Llama-135m)."},
    )
    loss_normalizer: str = field(
        default="input_tokens",
        metadata={"help": "Summed token CE over input_tokens (OLMo/Instella: B x seq_len) or predicted_tokens."},
    )
    max_consecutive_nonfinite: int = field(default=5, metadata={"help": "Stop after this many bad steps in a row."})
    attn_implementation: str | None = field(default="sdpa", metadata={"help": "sdpa, flash_attention_2, eager."})
    model_dtype: str | None = field(default=None, metadata={"help": "Parameter dtype (default float32 masters)."})
    plugins: list[str] = field(default_factory=list, metadata={"help": "'package.module:function' import paths."})
    plugin_args: dict | str | None = field(default=None, metadata={"help": "Passed to every plugin."})
    torch_num_threads: int | None = field(
        default=None, metadata={"help": "CPU runs: intra-op threads (tiny models run faster on 1 thread)."}
    )
    fsdp_reduce_dtype: str | None = field(default="float32", metadata={"help": "FSDP bf16: gradient reduce dtype."})
    save_optimizer_state: bool = field(
        default=False, metadata={"help": "Write the final AdamW state to <output_dir>/optimizer_state/ (DCP)."}
    )
    load_optimizer_state: bool = field(
        default=False,
        metadata={"help": "Start from <model_name_or_path>/optimizer_state/ (moments kept, new step counter/LR)."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Replace a complete output in output_dir (of any stage) from scratch."}
    )

    def __post_init__(self):
        if self.load_optimizer_state and not self.model_name_or_path:
            raise ValueError(
                "load_optimizer_state: true needs model_name_or_path (the run whose optimizer_state/ to continue)"
            )
        check_range("global_batch_size", self.global_batch_size, 1, integer=True, allow_none=True)
        check_range("seq_len", self.seq_len, 2, integer=True, allow_none=True)
        if self.fit_global_batch and self.global_batch_size is None:
            raise ValueError("fit_global_batch: true needs global_batch_size (the batch to keep)")
        check_range("max_consecutive_nonfinite", self.max_consecutive_nonfinite, 1, integer=True)
        check_range("torch_num_threads", self.torch_num_threads, 1, integer=True, allow_none=True)
        check_choice("loss_normalizer", self.loss_normalizer, LOSS_NORMALIZERS)
        if self.predict_all_positions and self.data_paths:
            raise ValueError(
                "predict_all_positions reads (seq_len + 1)-token windows of a data_dir (lit_gpt's blocks); the token "
                "files of data_paths are read in the authors' seq_len instances: drop one of the two"
            )
        if self.model_config:  # a shape that cannot build is named here, before any data or weights are touched
            check_model_config(_as_dict(self.model_config, "model_config"))


def _as_dict(value, name: str) -> dict | None:
    if value is None or isinstance(value, dict):
        return value
    try:
        out = json.loads(value)
    except json.JSONDecodeError as err:
        raise RecipeError(f"{name}: expected a mapping (YAML) or JSON object string, got {value!r}: {err}") from None
    if not isinstance(out, dict):
        raise RecipeError(f"{name}: expected a mapping, got {value!r}")
    return out


def run_identity(script: PretrainArguments, train: TrainingArguments, data_manifest: dict) -> dict:
    """What makes this run this run; compared against an existing output folder."""
    volatile = ("data_dir", "data_paths", "data_root", "tokenizer", "torch_num_threads", "overwrite")
    identity = {k: v for k, v in asdict(script).items() if k not in volatile}
    identity.update({k: getattr(train, k) for k in _RUN_KEYS})
    # the global batch, not its split: a run may resume on another world size (per-device x accum x world equal)
    identity["global_batch"] = train.per_device_train_batch_size * train.gradient_accumulation_steps * train.world_size
    identity["lr_scheduler_type"] = str(getattr(train.lr_scheduler_type, "value", train.lr_scheduler_type))
    identity["data_fingerprint"] = data_manifest.get("fingerprint")
    identity["fingerprint"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()
    if data_manifest.get("files"):  # each token file's identity, so a refused resume names the file that changed
        identity["data_files"] = data_manifest["files"]
    return identity


def check_run_dir(output_dir: Path, identity: dict, overwrite: bool = False, inputs=()) -> dict | None:
    """None to go on; the finished manifest when this very run is already complete (and not `overwrite`). A complete
    output of anything else follows the rule of `core.io.check_output_dir` (replaced only with `overwrite`);
    another run's checkpoints raise (an interrupted run of this recipe resumes, with or without `overwrite`); a
    folder is another run's only once that run wrote a manifest or a checkpoint."""
    manifest = read_manifest(output_dir)
    same = manifest is not None and manifest.get("stage") == STAGE
    if same and manifest.get("run", {}).get("fingerprint") == identity["fingerprint"] and not overwrite:
        return manifest
    if same and not overwrite:
        raise RecipeError(
            f"output_dir {output_dir} holds a finished run with a different recipe, data or seed "
            f"(manifest.json); choose another output_dir, or pass --overwrite true to replace it"
        )
    check_output_dir(output_dir, overwrite, inputs=inputs)
    if manifest is not None:  # replaced with --overwrite: emptied by claim_output_dir, before the first byte
        return None
    run_file = output_dir / RUN_FILE
    if run_file.is_file() and not complete_checkpoints(output_dir):
        # A run that stopped before its first checkpoint left nothing to resume: it does not pin the folder.
        logger.info(f"pretrain: {output_dir} holds no checkpoint of its earlier run; starting this run there")
        return None
    if run_file.is_file():
        previous = json.loads(run_file.read_text())
        if previous.get("fingerprint") != identity["fingerprint"]:
            same_keys = ("fingerprint", "data_files")
            changed = sorted(k for k in identity if k not in same_keys and previous.get(k) != identity[k])
            detail = describe_data_change(previous.get("data_files"), identity.get("data_files"))
            raise RecipeError(
                f"output_dir {output_dir} holds checkpoints of a different run (changed: {', '.join(changed)}"
                f"{detail}); resume with the same recipe and data or choose another output_dir"
            )
    elif output_dir.is_dir() and any(p.name != ".staging" for p in output_dir.iterdir()):
        raise RecipeError(f"output_dir {output_dir} is not empty and holds no pretrain run; choose another one")
    return None


def _inputs(script: PretrainArguments) -> list[tuple[str, str]]:
    """The folders a run reads, which its output_dir must not be (or hold)."""
    return [("data_dir", script.data_dir), ("model_name_or_path", script.model_name_or_path)]


def load_plugins(paths: list[str], model, plugin_args: dict) -> list:
    """Call each `package.module:function(model, plugin_args)`; collect the TrainerCallbacks they return."""
    callbacks = []
    for spec in paths:
        module_name, _, fn_name = spec.partition(":")
        try:
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as err:
            raise RecipeError(f"plugin '{spec}': cannot import it ({err}); use 'package.module:function'") from None
        callbacks.extend(fn(model, plugin_args) or [])
    return callbacks


def _load_tokenizer(path):
    try:
        return load_tokenizer(path)
    except (OSError, ValueError) as err:
        raise RecipeError(f"tokenizer {path}: {err}") from None


def _data_and_tokenizer(script: PretrainArguments):
    if bool(script.data_dir) == bool(script.data_paths):
        raise RecipeError(
            "set data_dir (the output folder of scripts/prepare_data.py) or data_paths (OLMo token files), "
            + ("not both" if script.data_dir else "one of them")
        )
    if script.data_paths:
        return _token_files_and_tokenizer(script)
    data_manifest = require_verified(script.data_dir, "data_dir")  # checksums through the cache (data/integrity.py)
    if data_manifest.get("stage") != "prepare_data":
        raise RecipeError(f"data_dir {script.data_dir} is a '{data_manifest.get('stage')}' output, not prepare_data")
    dataset = PackedWindows(
        script.data_dir, data_manifest, script.document_masking, predict_all_positions=script.predict_all_positions
    )
    if len(dataset) == 0:
        raise RecipeError(f"data_dir {script.data_dir} holds no windows")
    if script.seq_len is not None and script.seq_len != dataset.seq_len:
        raise RecipeError(f"seq_len {script.seq_len}: data_dir {script.data_dir} holds {dataset.seq_len}-token rows")
    tok_path = script.tokenizer or os.path.join(script.data_dir, "tokenizer")
    tokenizer = _load_tokenizer(tok_path)
    if script.tokenizer and data_manifest.get("tokenizer_sha256"):
        json_path = Path(tok_path) if Path(tok_path).is_file() else Path(tok_path) / "tokenizer.json"
        if json_path.is_file() and file_digest(json_path) != data_manifest["tokenizer_sha256"]:
            raise RecipeError(f"tokenizer {tok_path} is not the one data_dir {script.data_dir} was tokenised with")
    return dataset, data_manifest, tokenizer


def _token_files_and_tokenizer(script: PretrainArguments):
    """Token files named by `data_paths`, checked before any work (missing, odd-sized, ids beyond the tokenizer)."""
    if script.seq_len is None:
        raise RecipeError("data_paths needs seq_len: the tokens per instance (the authors' max_sequence_length, 4096)")
    tok_path = script.tokenizer or script.model_name_or_path
    if not tok_path:
        raise RecipeError(
            "data_paths needs tokenizer: the tokenizer.json the token files were written with (Instella: "
            "recipes/instella-3b/tokenizer/allenai_eleuther-ai-gpt-neox-20b-pii-special.json)"
        )
    tokenizer = _load_tokenizer(tok_path)
    entries, dataset = token_files_from_args(
        script.data_paths, script.data_root, script.seq_len, len(tokenizer), tokenizer.eos_token_id,
        script.document_masking,
    )  # fmt: skip
    if len(dataset) == 0:
        raise RecipeError(f"data_paths: none of the {len(entries)} token files holds {script.seq_len} tokens")
    items = dataset.fingerprint_items(entries)
    data_manifest = {"fingerprint": hashlib.sha256(json.dumps(items).encode()).hexdigest(), "instances": len(dataset),
                     "files": items[1:]}  # fmt: skip
    return dataset, data_manifest, tokenizer


def _model_config(script: PretrainArguments):
    """The config to check the data against before any model is built (None: `build_model` reports the problem)."""
    if script.model_name_or_path:
        try:
            return AutoConfig.from_pretrained(script.model_name_or_path, trust_remote_code=True)
        except (OSError, ValueError) as err:
            raise RecipeError(f"model_name_or_path {script.model_name_or_path}: {err}") from None
    fields = dict(script.model_config or {})
    try:
        return AutoConfig.for_model(fields.pop("model_type"), **fields)
    except (KeyError, ValueError, TypeError):
        return None


def _check_fits(config, dataset: PackedWindows | TokenFiles, tokenizer) -> None:
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None and dataset.seq_len > max_pos:
        if isinstance(dataset, TokenFiles):
            what, fix = f"seq_len {dataset.seq_len} is", f"set seq_len <= {max_pos}"
        else:
            what, fix = f"windows of {dataset.seq_len} tokens are", f"prepare the data with seq_len <= {max_pos}"
        raise RecipeError(f"{what} longer than the model's max_position_embeddings ({max_pos}): {fix}")
    check_tokenizer_fits(config, tokenizer)


def _prepare_output_dir(output_dir: Path, identity: dict, train: TrainingArguments, script) -> None:
    """Rank 0 claims the folder (the rule of `core.io`: with --overwrite it is emptied, manifest first), drops a
    half-written `.staging` checkpoint of a killed run (never resumed from) and pins the run."""
    if train.process_index == 0:
        claim_output_dir(output_dir, script.overwrite, inputs=_inputs(script))
        shutil.rmtree(output_dir / STAGING, ignore_errors=True)
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / RUN_FILE).write_text(json.dumps(identity, indent=2, default=str) + "\n")


def _build_model_and_callbacks(script: PretrainArguments, train: TrainingArguments, dataset, tokenizer):
    config = _model_config(script)
    if config is not None:
        _check_fits(config, dataset, tokenizer)
    model = build_model(
        script.model_name_or_path, script.model_config, script.init, script.attn_implementation, script.model_dtype,
        train.seed,
    )  # fmt: skip
    _check_fits(model.config, dataset, tokenizer)
    from transformers.loss.loss_utils import ForCausalLMLoss

    if script.predict_all_positions and model.loss_function is not ForCausalLMLoss:
        raise RecipeError(
            f"predict_all_positions: {type(model).__name__}'s loss is not transformers' ForCausalLMLoss, which reads "
            f"the pre-shifted targets (shift_labels); use a causal LM with the standard loss or drop the option"
        )
    return model, load_plugins(script.plugins, model, script.plugin_args)


def _olmo_sampler(dataset, train: TrainingArguments) -> OLMoOrderSampler | None:
    """Token files are read in the authors' order (seed = data_seed or seed, as their `data.seed` or `seed`)."""
    if not isinstance(dataset, TokenFiles):
        return None
    global_batch = train.per_device_train_batch_size * train.gradient_accumulation_steps * train.world_size
    seed = train.data_seed if train.data_seed is not None else train.seed
    sampler = OLMoOrderSampler(len(dataset), global_batch, train.per_device_train_batch_size, train.world_size, seed)
    if sampler.steps == 0:
        raise RecipeError(
            f"data_paths: {len(dataset)} instances of {dataset.seq_len} tokens are fewer than one global batch "
            f"({global_batch})"
        )
    return sampler


def _report_divergence(script: PretrainArguments, trainer, nonfinite, output_dir: Path) -> None:
    logger.error(
        f"{script.max_consecutive_nonfinite} non-finite steps in a row from step {nonfinite.diverged_at} "
        f"({trainer.skipped_steps} skipped in all); stopped at step {trainer.state.global_step}. The checkpoint "
        f"{output_dir}/checkpoint-{trainer.state.global_step} holds the weights from before the divergence "
        f"(no update was applied since): lower the learning rate or inspect the data and resume from it."
    )
    raise SystemExit(3)


def _save_final(trainer, script, train, dataset, data_manifest, identity, output_dir: Path, argv) -> None:
    """The final model as one HF safetensors folder, the trainer state, then the manifest (last)."""
    fsdp_plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if fsdp_plugin is not None:
        # checkpoints stay sharded (DCP, fast, reshapeable); the final model is one HF safetensors folder
        fsdp_plugin.set_state_dict_type("FULL_STATE_DICT")
    trainer.save_model(str(output_dir))
    trainer.save_state()
    if script.save_optimizer_state:  # every rank writes its shards; before the manifest, like everything else
        save_optimizer_state(trainer.model, trainer.optimizer, output_dir / OPTIMIZER_DIR)
    if not trainer.is_world_process_zero():
        return
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    global_batch = train.per_device_train_batch_size * train.gradient_accumulation_steps * train.world_size
    write_manifest(
        output_dir,
        STAGE,
        run=identity,
        recipe=str(config_path(argv)) if config_path(argv) else None,
        argv=argv,
        arguments=resolved_arguments(script=script, training=train),
        data_dir=str(script.data_dir) if script.data_dir else None,
        data_paths=script.data_paths,
        data_root=script.data_root,
        data_fingerprint=data_manifest.get("fingerprint"),
        seed=train.seed,
        world_size=train.world_size,  # the processes that trained it, as the run saw them
        global_step=trainer.state.global_step,
        skipped_steps=trainer.skipped_steps,
        final_loss=losses[-1] if losses else None,
        tokens_seen=trainer.state.global_step * global_batch * dataset.seq_len,
    )


def pretrain(script: PretrainArguments, train: TrainingArguments, argv: list[str]) -> int:
    """One pretraining run; returns the exit code (0, or 3 after a divergence, via SystemExit). SIGTERM/SIGUSR1 at
    any phase end it with 0 in a consistent state: before training nothing is written, during training a checkpoint
    is saved, during the final save that save completes."""
    preemption = PreemptionCallback()
    preemption.install()  # takes over a request that arrived while the entry point was importing
    try:  # a full disk is named with the output folder (once `_pretrain` has resolved its name)
        if _stop_before_training(preemption, "before loading anything"):
            return 0
        with naming_write_failures(lambda: train.output_dir, "writing the run's files"):
            return _pretrain(script, train, argv, preemption)
    finally:
        preemption.restore()


def _stop_before_training(preemption: PreemptionCallback, where: str) -> bool:
    if preemption.requested:
        logger.info(f"pretrain: pre-empted during start-up ({where}); nothing was written. Rerun to start.")
    return preemption.requested


def _pretrain(script: PretrainArguments, train: TrainingArguments, argv: list[str], preemption) -> int:
    script.model_config = _as_dict(script.model_config, "model_config")
    script.plugin_args = _as_dict(script.plugin_args, "plugin_args") or {}
    # `output_dir: runs/stage2_{seed}`: the project's one placeholder syntax (as in pipeline YAMLs)
    train.output_dir = fill_placeholders(train.output_dir, {"seed": train.seed}, "output_dir")
    output_dir = check_output_dir(train.output_dir, overwrite=True, inputs=_inputs(script))  # location + inputs
    if script.torch_num_threads:
        torch.set_num_threads(script.torch_num_threads)
    check_schedule_kwargs(train.lr_scheduler_kwargs)
    optimizer_state = None
    if script.load_optimizer_state:
        optimizer_state = check_optimizer_state(Path(script.model_name_or_path) / OPTIMIZER_DIR)
    dataset, data_manifest, tokenizer = _data_and_tokenizer(script)
    if script.fit_global_batch:
        train.gradient_accumulation_steps = fit_accumulation(
            script.global_batch_size, train.per_device_train_batch_size, train.world_size
        )
    identity = run_identity(script, train, data_manifest)
    global_batch = train.per_device_train_batch_size * train.gradient_accumulation_steps * train.world_size
    check_training_length(train.max_steps, train.num_train_epochs, len(dataset), global_batch, "windows of data_dir")
    if check_run_dir(output_dir, identity, script.overwrite, _inputs(script)) is not None:
        logger.info(f"pretrain: {output_dir} already holds this finished run; nothing to do")
        return 0
    if script.global_batch_size is not None:
        check_global_batch(
            script.global_batch_size, train.per_device_train_batch_size, train.gradient_accumulation_steps,
            train.world_size,
        )  # fmt: skip
    model, callbacks = _build_model_and_callbacks(script, train, dataset, tokenizer)
    sampler = _olmo_sampler(dataset, train)
    # Training needs no KV cache, and transformers derives the per-document mask from position_ids
    # (document_masking) only when no cache is passed; the saved config gets use_cache back.
    use_cache = getattr(model.config, "use_cache", None)
    model.config.use_cache = False
    resume = resolve_resume(train.resume_from_checkpoint, output_dir)
    if resume is not None and not Path(resume).is_dir():
        raise RecipeError(f"resume_from_checkpoint {resume} does not exist")
    if _stop_before_training(preemption, "after loading the model and data"):
        return 0
    _prepare_output_dir(output_dir, identity, train, script)

    trainer = PretrainTrainer(
        model=model,
        args=train,
        train_dataset=dataset,
        data_collator=TokenFiles.collate if isinstance(dataset, TokenFiles) else default_data_collator,
        processing_class=tokenizer,
        callbacks=[preemption, *callbacks],
        fsdp_reduce_dtype=script.fsdp_reduce_dtype,
        optimizer_state_from=optimizer_state,
        loss_normalizer=script.loss_normalizer,
        train_sampler=sampler,
    )
    nonfinite = NonFiniteCallback(trainer, script.max_consecutive_nonfinite)
    trainer.add_callback(nonfinite)
    if _stop_before_training(preemption, "after building the trainer"):
        return 0
    if resume:
        logger.info(f"pretrain: resuming from {resume}")
    with naming_write_failures(output_dir, "saving a checkpoint"):
        trainer.train(resume_from_checkpoint=resume)
    if nonfinite.diverged_at is not None:
        _report_divergence(script, trainer, nonfinite, output_dir)
    if nonfinite.all_skipped():
        logger.error(
            f"every one of the {trainer.state.global_step - nonfinite.start_step} steps of this run was skipped "
            f"(non-finite loss or gradients): nothing was trained and no final model or manifest was written. Check "
            f"the input weights and the data, or lower the learning rate."
        )
        raise SystemExit(3)
    if preemption.preempted:
        logger.info(f"pretrain: pre-empted; saved checkpoint-{trainer.state.global_step}. Rerun to resume.")
        return 0
    if use_cache is not None:
        model.config.use_cache = use_cache
    with naming_write_failures(output_dir, "saving the final model"):
        _save_final(trainer, script, train, dataset, data_manifest, identity, output_dir, argv)
    return 0


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/pretrain.py`: parse the recipe and the command line, then run `pretrain`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    script, train = parse_recipe([PretrainArguments, CheckedTrainingArguments], argv)
    setup_logging()
    return pretrain(script, train, argv)
