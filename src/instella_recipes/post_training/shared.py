"""What the post-training stages share: the recipe fields beyond TRL's configs (`PostTrainingInputs`, every
post-training stage's: SFT, DPO and GRPO; `PostTrainingSettings`, those of the chat-data stages SFT and DPO, mixed into
`CheckedSFTConfig` / `CheckedDPOConfig`), TRL's `ModelConfig` with its LoRA numbers checked, and `PostTrainingStage`:
the hooks of the training lifecycle (`trainer/stage.py`) that both stages fill the same way (the input model and
tokenizer, the checked mixture, the TRL trainer, the LoRA merge and data report beside the model).
"""

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml
from accelerate import PartialState
from transformers import AutoModelForCausalLM
from trl import ModelConfig, get_peft_config

import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)
from instella_recipes.core import RecipeError, check_range, check_training_length, get_logger, read_manifest
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.trainer.checks import check_global_batch, check_tokenizer_fits, readers, rows_per_step
from instella_recipes.trainer.settings import DATA, LAUNCH, RUN, StageSettings
from instella_recipes.trainer.stage import Stage
from instella_recipes.weights import check_model_folder, check_tokenizer_folder, load_pretrained
from instella_recipes.weights.safetensors_io import check_model_finite

from .checks import OVERLONG_POLICIES
from .converters import MMLU_DATA_SEED
from .mixture import build_mixture
from .template import install_chat_template

INSTELLA_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

logger = get_logger(__name__)


# The keys the post-training fields replaced, and what to write instead (core.recipe names them).
RETIRED_KEYS = {"template_path": "the chat template file is chat_template_path (TRL's SFTConfig name) in every stage"}
CHAT_TEMPLATE_FILES = (".jinja", ".j2")


@dataclass
class PostTrainingInputs(StageSettings):
    """Recipe fields of every post-training stage (SFT, DPO, GRPO), mixed in before TRL's config (`ModelConfig` holds
    the input model and the LoRA block: `use_peft`, `lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`)."""

    retired_keys = RETIRED_KEYS

    # Typed as strings so the command line can give them too (`--sources '{path: a.jsonl, repeat: 2}' b.jsonl`);
    # YAML mappings from the recipe file arrive as dicts and are kept.
    sources: list[str] = field(
        default_factory=list,
        metadata={"role": DATA, "help": "Data sources: YAML mappings {path, split, config_name, ...} or paths."},
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"role": RUN, "help": "Default: the input model's folder."}
    )
    # TRL's SFTConfig has this field (it loads a .jinja file onto the tokenizer, the template installed here anyway);
    # declared here for DPO and GRPO, whose configs do not, so every stage names the chat template alike.
    chat_template_path: str | None = field(
        default=None, metadata={"role": RUN, "help": "Chat template file (.jinja); default: Instella's."}
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={"role": RUN, "help": "Rows (GRPO: completions) per optimizer update; checked against the launch."},
    )
    max_skip_fraction: float = field(
        default=0.01, metadata={"role": LAUNCH, "help": "Error if more rows than this are skipped."}
    )
    max_samples: int | None = field(
        default=None, metadata={"role": RUN, "help": "Use only the first N rows (smoke runs)."}
    )
    torch_num_threads: int | None = field(
        default=None,
        metadata={"role": LAUNCH, "help": "CPU runs: intra-op threads (tiny models run faster on 1 thread)."},
    )

    def __post_init__(self):
        check_range("max_skip_fraction", self.max_skip_fraction, 0, 1)
        check_range("global_batch_size", self.global_batch_size, 1, integer=True, allow_none=True)
        check_range("max_samples", self.max_samples, 1, integer=True, allow_none=True)
        check_range("torch_num_threads", self.torch_num_threads, 1, integer=True, allow_none=True)
        if self.chat_template_path and not str(self.chat_template_path).endswith(CHAT_TEMPLATE_FILES):
            suffixes = " or ".join(CHAT_TEMPLATE_FILES)
            raise RecipeError(f"chat_template_path {self.chat_template_path}: give a jinja template file ({suffixes})")
        self.sources = [_parse_source(s) for s in self.sources]
        if self.torch_num_threads:  # tiny models: thread sync costs more than a second core gains
            torch.set_num_threads(self.torch_num_threads)
        super().__post_init__()


@dataclass
class PostTrainingSettings(PostTrainingInputs):
    """Recipe fields of the chat-data stages (SFT, DPO) beside `PostTrainingInputs`'."""

    overlong: str = field(
        default="truncate", metadata={"role": RUN, "help": "Rows longer than max_length: truncate | drop."}
    )
    allow_no_signal: bool = field(
        default=False,
        metadata={"role": LAUNCH, "help": "Train even when no row carries a training signal (checks.py)."},
    )
    merge_lora: bool = field(
        default=True, metadata={"role": RUN, "help": "With LoRA: merge into full weights in output_dir."}
    )
    conversion_seed: int = field(
        default=MMLU_DATA_SEED,
        metadata={
            "role": RUN,
            "help": "Seed of the converters' random choices (MMLU options + template); authors: 96.",
        },
    )

    def __post_init__(self):
        if self.overlong not in OVERLONG_POLICIES:
            raise ValueError(f"overlong must be one of {OVERLONG_POLICIES}, not '{self.overlong}'")
        check_range("conversion_seed", self.conversion_seed, 0, integer=True)
        super().__post_init__()


@dataclass
class CheckedModelConfig(ModelConfig):
    """TRL's ModelConfig with the LoRA numbers checked."""

    # ModelConfig's fields that define the run: the input model and the LoRA block
    library_roles = dict.fromkeys(
        ("model_name_or_path", "use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules"), RUN
    )

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


def load_tokenizer_with_template(args: PostTrainingInputs, model_args):
    """The tokenizer (its own path, else the input model's folder) with the Instella chat template installed."""
    model_path = model_args.model_name_or_path
    if not args.tokenizer_name_or_path:
        check_tokenizer_folder(model_path, "model_name_or_path", " or pass tokenizer_name_or_path")
    tokenizer = load_tokenizer(args.tokenizer_name_or_path or model_path)
    return install_chat_template(tokenizer, args.chat_template_path)


def cap_rows(dataset, args: PostTrainingSettings):
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
    # a local folder by its absolute path: a LoRA adapter records it as its base, which must load from anywhere
    path = str(Path(path).resolve()) if Path(path).is_dir() else path
    dtype = getattr(torch, model_args.dtype) if model_args.dtype not in (None, "auto") else model_args.dtype
    model = load_pretrained(
        AutoModelForCausalLM.from_pretrained, path, "model_name_or_path", dtype=dtype,
        attn_implementation=model_args.attn_implementation, revision=model_args.model_revision,
    )  # fmt: skip
    check_model_finite(model, f"model_name_or_path {model_args.model_name_or_path}")
    return model


def check_rope_theta(expected: float | None, config, source) -> None:
    """A recipe that states the RoPE base (`rope_theta`) of a model that carries another one: an error."""
    if expected is None:
        return
    have = (getattr(config, "rope_parameters", None) or {}).get("rope_theta", getattr(config, "rope_theta", None))
    if have is not None and float(have) != float(expected):
        raise RecipeError(
            f"rope_theta {expected:g} (recipe) but model_name_or_path {source} has {float(have):g}: train from the "
            f"model the recipe names, or reconfigure it (python scripts/convert_checkpoint.py reconfigure)"
        )


def check_launch(args, model, tokenizer) -> None:
    check_tokenizer_fits(model.config, tokenizer)
    if args.global_batch_size:
        check_global_batch(
            args.global_batch_size, args.per_device_train_batch_size, args.gradient_accumulation_steps, readers(args)
        )


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


@dataclass
class PostTrainingData:
    """What `load_data` hands on: the tokenizer with the chat template, the tokenized rows and the data report."""

    tokenizer: object
    dataset: object
    report: dict


class PostTrainingStage(Stage):
    """What SFT and DPO share in the lifecycle (`trainer/stage.py`): the input model checked before any work, the
    tokenizer with the chat template, the checked and tokenized mixture (rank 0 first), the model, the TRL trainer,
    and beside the model the LoRA adapter (merged into full weights on the main process), the data report and the
    manifest's inputs. A subclass sets `name`, `trainer_class`, `prepare` (tokenize + report) and the mixture
    keywords."""

    trainer_class = None
    mixture_kwargs: dict = {}

    def prepare(self, mixture, tokenizer):
        """The tokenized rows and their report (`tokenization.prepare_*_dataset`)."""
        raise NotImplementedError

    def trainer_kwargs(self) -> dict:
        return {}

    def check(self) -> None:
        check_model_path(self.model_args)  # once, before the data is tokenized (also for a tokenizer from elsewhere)

    def load_data(self) -> PostTrainingData:
        args = self.args
        tokenizer = load_tokenizer_with_template(args, self.model_args)
        self.stop_point("after loading the tokenizer")
        # Rank 0 builds and tokenizes the mixture first; the other ranks then load it from the datasets cache
        # (accelerate's `main_process_first`, as TRL's own dataset preparation does).
        with PartialState().main_process_first():
            mixture, sources = build_mixture(
                args.sources, seed=args.seed, num_proc=args.dataset_num_proc, conversion_seed=args.conversion_seed,
                **self.mixture_kwargs,
            )  # fmt: skip
            train, report = self.prepare(cap_rows(mixture, args), tokenizer)
        logger.info(report.summary())
        report.check(args.max_skip_fraction, args.allow_no_signal)
        check_training_length(args.max_steps, args.num_train_epochs, len(train), rows_per_step(args),
                              "rows of the mixture")  # fmt: skip
        return PostTrainingData(
            tokenizer, train, {"sources": sources, **report.as_dict(), "summary": report.summary()}
        )

    def build_model(self, data: PostTrainingData):
        model = load_model(self.model_args)
        check_launch(self.args, model, data.tokenizer)
        return model

    def build_trainer(self, data: PostTrainingData, model, callbacks: list):
        return self.trainer_class(
            model=model,
            args=self.args,
            train_dataset=data.dataset,
            processing_class=data.tokenizer,
            peft_config=get_peft_config(self.model_args),
            callbacks=callbacks or None,
            **self.feature_kwargs(data, model),
            **self.trainer_kwargs(),
        )

    def model_folder(self) -> Path:
        return self.output_dir / "adapter" if self.model_args.use_peft else self.output_dir

    def save_extras(self, trainer, data: PostTrainingData) -> None:
        """On the main process: a LoRA adapter merged into full weights (from a fresh CPU copy of the base, so it
        works under any sharding) with the tokenizer beside them, and the data report."""
        if not trainer.is_world_process_zero():
            return
        out = self.output_dir
        if self.model_args.use_peft and self.args.merge_lora:
            merge_adapter(self.model_args.model_name_or_path, out / "adapter", out)
        if self.model_args.use_peft:
            trainer.processing_class.save_pretrained(out)
        (out / "data_report.json").write_text(json.dumps(data.report, indent=2) + "\n")
        logger.info(data.report["summary"])

    def manifest_fields(self, trainer, data: PostTrainingData) -> dict:
        peft = self.model_args.use_peft
        return {
            "inputs": {
                "model": self.model_args.model_name_or_path,
                "model_manifest": read_manifest_safe(self.model_args),
            },
            "lora": lora_settings(self.model_args, self.args.merge_lora) if peft else None,
            "data": data.report,
        }
