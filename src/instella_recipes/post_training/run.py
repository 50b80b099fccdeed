"""What SFT (`sft.py`) and DPO (`dpo.py`) share: the recipe fields beyond TRL's configs (`PostTrainingArguments`) and
TRL's `ModelConfig` with its LoRA numbers checked, loading the input model and tokenizer, building the trainer
(`build_trainer_for`), writing the output folder (model + tokenizer with the chat template, trainer_state.json, the
data report, manifest.json last), and stopping cleanly on SIGTERM/SIGUSR1 at any phase (`run_post_training`)."""

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate import PartialState
from transformers import AutoModelForCausalLM
from trl import ModelConfig, get_peft_config

import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)
from instella_recipes.core import (
    check_output_dir,
    check_range,
    check_training_length,
    claim_output_dir,
    file_digest,
    get_logger,
    naming_write_failures,
    read_manifest,
    resolved_arguments,
    write_manifest,
)
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.trainer.callbacks import PreemptionCallback
from instella_recipes.trainer.checkpoints import find_resume_checkpoint
from instella_recipes.trainer.checks import check_global_batch, check_tokenizer_fits
from instella_recipes.trainer.optim import check_schedule_kwargs
from instella_recipes.weights import check_model_folder, check_tokenizer_folder, load_pretrained
from instella_recipes.weights.safetensors_io import check_model_finite

from .checks import OVERLONG_POLICIES
from .converters import MMLU_DATA_SEED
from .mixture import build_mixture
from .template import install_chat_template

INSTELLA_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

logger = get_logger(__name__)


@dataclass
class PostTrainingArguments:
    """Recipe fields of both post-training stages (TRL's SFTConfig/DPOConfig and ModelConfig hold the rest; the
    LoRA block is ModelConfig's `use_peft`, `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`)."""

    # Typed as strings so the command line can give them too (`--sources '{path: a.jsonl, repeat: 2}' b.jsonl`);
    # YAML mappings from the recipe file arrive as dicts and are kept.
    sources: list[str] = field(default_factory=list, metadata={"help": "Data sources: YAML mappings or paths."})
    tokenizer_name_or_path: str | None = field(default=None, metadata={"help": "Default: the input model's folder."})
    template_path: str | None = field(default=None, metadata={"help": "Chat template file; default: Instella's."})
    global_batch_size: int | None = field(default=None, metadata={"help": "Checked against the launch if set."})
    overlong: str = field(default="truncate", metadata={"help": "Rows longer than max_length: truncate | drop."})
    max_skip_fraction: float = field(default=0.01, metadata={"help": "Error if more rows than this are skipped."})
    allow_no_signal: bool = field(
        default=False, metadata={"help": "Train even when no row carries a training signal (checks.py)."}
    )
    merge_lora: bool = field(default=True, metadata={"help": "With LoRA: merge into full weights in output_dir."})
    max_samples: int | None = field(default=None, metadata={"help": "Use only the first N mixed rows (smoke runs)."})
    torch_num_threads: int | None = field(
        default=None, metadata={"help": "CPU runs: intra-op threads (tiny models run faster on 1 thread)."}
    )
    conversion_seed: int = field(
        default=MMLU_DATA_SEED,
        metadata={"help": "Seed of the converters' random choices (MMLU options + template); authors: 96."},
    )
    overwrite: bool = field(
        default=False, metadata={"help": "Replace a complete output in output_dir (of any stage) from scratch."}
    )

    def __post_init__(self):
        check_range("max_skip_fraction", self.max_skip_fraction, 0, 1)
        check_range("global_batch_size", self.global_batch_size, 1, integer=True, allow_none=True)
        check_range("max_samples", self.max_samples, 1, integer=True, allow_none=True)
        check_range("torch_num_threads", self.torch_num_threads, 1, integer=True, allow_none=True)
        self.sources = [_parse_source(s) for s in self.sources]
        if self.torch_num_threads:  # tiny models: thread sync costs more than a second core gains
            torch.set_num_threads(self.torch_num_threads)
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, not '{self.overlong}'")
        check_range("conversion_seed", self.conversion_seed, 0, integer=True)


@dataclass
class CheckedModelConfig(ModelConfig):
    """TRL's ModelConfig with the LoRA numbers checked."""

    def __post_init__(self):
        check_range("lora_r", self.lora_r, 1, integer=True)
        check_range("lora_alpha", self.lora_alpha, 0, low_open=True)
        check_range("lora_dropout", self.lora_dropout, 0, 1, high_open=True)
        super().__post_init__()


def _parse_source(source) -> dict:
    if isinstance(source, str):
        parsed = yaml.safe_load(source)
        return parsed if isinstance(parsed, dict) else {"path": source}
    return source


def load_tokenizer_with_template(args: PostTrainingArguments, model_args):
    """The tokenizer (its own path, else the input model's folder) with the Instella chat template installed."""
    model_path = model_args.model_name_or_path
    if not args.tokenizer_name_or_path:
        check_tokenizer_folder(model_path, "model_name_or_path", " or pass tokenizer_name_or_path")
    tokenizer = load_tokenizer(args.tokenizer_name_or_path or model_path)
    return install_chat_template(tokenizer, args.template_path)


def cap_rows(dataset, args: PostTrainingArguments):
    """The first `max_samples` rows of the shuffled mixture (smoke runs, tests); the whole mixture otherwise."""
    if args.max_samples is not None and args.max_samples < len(dataset):
        return dataset.select(range(args.max_samples))
    return dataset


def check_model_path(model_args) -> None:
    """A clear error before any work when the input model folder is missing or is not a model folder."""
    check_model_folder(model_args.model_name_or_path, "model_name_or_path", allow_hub_id=True)
    note_input(model_args)


def load_model(model_args):
    """The input model (any HF folder or Hub id with an Instella or other causal LM) in `model_args.dtype`; its
    folder was checked by `check_model_path` before any work."""
    path = model_args.model_name_or_path
    dtype = getattr(torch, model_args.dtype) if model_args.dtype not in (None, "auto") else model_args.dtype
    model = load_pretrained(
        AutoModelForCausalLM.from_pretrained, path, "model_name_or_path", dtype=dtype,
        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision,
    )  # fmt: skip
    check_model_finite(model, f"model_name_or_path {path}")
    return model


def check_launch(args: PostTrainingArguments, training_args, model, tokenizer) -> None:
    check_tokenizer_fits(model.config, tokenizer)
    if args.global_batch_size:
        check_global_batch(
            args.global_batch_size,
            training_args.per_device_train_batch_size,
            training_args.gradient_accumulation_steps,
            training_args.world_size,
        )


def resume_checkpoint(training_args) -> str | None:
    """An explicit `resume_from_checkpoint`, else the newest *complete* checkpoint in output_dir (one with its
    trainer_state.json, which the Trainer writes last), so an interrupted run resumes and a half-written one is
    passed over."""
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    return find_resume_checkpoint(training_args.output_dir)


def save_outputs(trainer, model_args, args: PostTrainingArguments, recipe: str | None, stage: str, data: dict) -> Path:
    """Save the trained model (LoRA: the adapter in `adapter/`, then merged into full weights on the main process,
    from a fresh CPU copy of the base so it works under any sharding), the tokenizer with its chat template, the
    trainer state, the data report, and the manifest last."""
    out = Path(trainer.args.output_dir)
    peft = model_args.use_peft
    trainer.save_model(str(out / "adapter") if peft else str(out))
    trainer.save_state()
    if not trainer.is_world_process_zero():
        return out
    if peft and args.merge_lora:
        merge_adapter(model_args.model_name_or_path, out / "adapter", out)
    if peft:
        trainer.processing_class.save_pretrained(out)
    (out / "data_report.json").write_text(json.dumps(data, indent=2) + "\n")
    fields = {
        "recipe": recipe,
        "recipe_sha256": file_digest(recipe) if recipe and Path(recipe).is_file() else None,
        "inputs": {"model": model_args.model_name_or_path, "model_manifest": read_manifest_safe(model_args)},
        "seed": trainer.args.seed,
        "global_step": trainer.state.global_step,
        "lora": lora_settings(model_args, args.merge_lora) if peft else None,
        "arguments": resolved_arguments(script=args, model=model_args, training=trainer.args),
        "data": data,
    }
    write_manifest(out, stage, **fields)
    return out


def lora_settings(model_args, merged: bool) -> dict:
    """The LoRA block of a run, as the manifest and the model card record it."""
    targets = model_args.lora_target_modules
    return {
        "r": model_args.lora_r,
        "alpha": model_args.lora_alpha,
        "dropout": model_args.lora_dropout,
        "target_modules": list(targets) if isinstance(targets, list | tuple) else targets,
        "merged": merged,
    }


def read_manifest_safe(model_args) -> dict | None:
    path = model_args.model_name_or_path
    return read_manifest(path) if path and Path(path).is_dir() else None


def note_input(model_args) -> None:
    """Say where the input comes from: a finished stage of this project (its manifest) or any other HF folder."""
    manifest = read_manifest_safe(model_args)
    if manifest:
        stage, finished = manifest.get("stage"), manifest.get("finished_at")
        logger.info(f"input {model_args.model_name_or_path}: stage '{stage}' finished {finished}")
    elif Path(model_args.model_name_or_path or "").is_dir():
        logger.warning(
            f"input {model_args.model_name_or_path}: no manifest.json (not made by this project's pipeline)"
        )


def merge_adapter(base_path: str, adapter_dir: Path, output_dir: Path) -> None:
    """Base model + LoRA adapter -> one normal HF folder (loads with `from_pretrained`, no PEFT needed)."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    merged.save_pretrained(output_dir)


def recipe_path(argv: list[str] | None) -> str | None:
    argv = list(sys.argv[1:] if argv is None else argv)
    return argv[argv.index("--config") + 1] if "--config" in argv else None


class StoppedBeforeTraining(Exception):
    """A stop request (SIGTERM/SIGUSR1) arrived during start-up; nothing was written (`run_post_training` exits 0)."""


def _stop_point(preemption: PreemptionCallback | None, where: str) -> None:
    """Between start-up phases: stop now if a stop request has arrived (the phase itself ran to its end)."""
    if preemption is not None and preemption.requested:
        raise StoppedBeforeTraining(where)


def build_trainer_for(
    trainer_cls, prepare, args: PostTrainingArguments, training_args, model_args, preemption=None, trainer_kwargs=None,
    **mixture_kwargs,
):  # fmt: skip
    """What SFT and DPO share up to a ready trainer: tokenizer with the chat template, the checked data mixture
    (`prepare` tokenizes it and reports skips), the model, the launch checks. `trainer_kwargs` go to the trainer
    class beside the usual arguments. Returns (trainer, data report). With `preemption` (the PreemptionCallback
    `run_post_training` installed) the trainer gets it, and a stop request ends start-up at the next phase boundary
    with `StoppedBeforeTraining`, before anything is written. The output folder follows the rule of `core.io`: checked
    first, claimed (emptied with --overwrite) only once everything else has passed, just before the trainer writes
    into it."""
    inputs = [("model_name_or_path", model_args.model_name_or_path)]
    check_output_dir(training_args.output_dir, args.overwrite, inputs=inputs)
    check_model_path(model_args)  # once, before the data is tokenized (also when the tokenizer comes from elsewhere)
    check_schedule_kwargs(training_args.lr_scheduler_kwargs)
    _stop_point(preemption, "before loading anything")
    tokenizer = load_tokenizer_with_template(args, model_args)
    _stop_point(preemption, "after loading the tokenizer")
    # Rank 0 builds and tokenizes the mixture first; the other ranks then load it from the datasets cache
    # (accelerate's `main_process_first`, as TRL's own dataset preparation does).
    with PartialState().main_process_first():
        mixture, sources = build_mixture(
            args.sources,
            seed=training_args.seed,
            num_proc=training_args.dataset_num_proc,
            conversion_seed=args.conversion_seed,
            **mixture_kwargs,
        )
        mixture = cap_rows(mixture, args)
        train, report = prepare(
            mixture, tokenizer, training_args.max_length, args.overlong, training_args.dataset_num_proc
        )
    logger.info(report.summary())
    report.check(args.max_skip_fraction, args.allow_no_signal)
    per_step = training_args.per_device_train_batch_size * training_args.gradient_accumulation_steps
    check_training_length(
        training_args.max_steps, training_args.num_train_epochs, len(train), per_step * training_args.world_size,
        "rows of the mixture",
    )  # fmt: skip
    _stop_point(preemption, "after preparing the data")
    model = load_model(model_args)
    _stop_point(preemption, "after loading the model")
    check_launch(args, training_args, model, tokenizer)
    if PartialState().is_main_process:
        claim_output_dir(training_args.output_dir, args.overwrite, inputs=inputs)
    trainer = trainer_cls(
        model=model,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[preemption] if preemption is not None else None,
        **(trainer_kwargs or {}),
    )
    _stop_point(preemption, "after building the trainer")
    return trainer, {"sources": sources, **report.as_dict(), "summary": report.summary()}


def train_and_save(
    trainer, data: dict, args: PostTrainingArguments, training_args, model_args, argv, stage: str, preemption=None
) -> Path | None:
    """Train (resuming from the newest checkpoint in output_dir, if any), then write the output folder. Returns
    None when the run was pre-empted: it saved a checkpoint to resume from and wrote nothing else (no manifest). A
    write that fails in torch's checkpoint writer (a full disk) is named with the folder (`naming_write_failures`)."""
    with naming_write_failures(training_args.output_dir, f"{stage}: training and saving"):
        trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
        if preemption is not None and preemption.preempted:
            logger.info(f"{stage}: pre-empted; saved checkpoint-{trainer.state.global_step}. Rerun to resume.")
            return None
        out = save_outputs(trainer, model_args, args, recipe_path(argv), stage, data)
    logger.info(data["summary"])
    logger.info(f"{stage.upper()} model written to {out}")
    return out


def run_post_training(build_trainer, args: PostTrainingArguments, training_args, model_args, argv, stage: str) -> int:
    """A whole SFT or DPO run (`build_trainer(args, training_args, model_args, preemption=...)` is the stage's own);
    returns the exit code, 0. SIGTERM/SIGUSR1 at any phase end it with 0 in a consistent state: during start-up
    (tokenizer, dataset map, model load, trainer) at the next phase boundary with nothing written; during training
    with a checkpoint and no manifest (the next run resumes from it); during the final save after that save."""
    preemption = PreemptionCallback()
    preemption.install()
    try:
        trainer, data = build_trainer(args, training_args, model_args, preemption=preemption)
        train_and_save(trainer, data, args, training_args, model_args, argv, stage, preemption)
    except StoppedBeforeTraining as stop:
        logger.info(f"{stage}: pre-empted during start-up ({stop}); nothing was written. Rerun to start.")
    finally:
        preemption.restore()
    return 0
