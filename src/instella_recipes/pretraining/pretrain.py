"""Pretraining with the transformers Trainer: everything `scripts/pretrain.py` runs.

The data is a prepare_data folder of packed windows (`data_dir`, the Trainer's seeded shuffle), OLMo token files
(`data_paths`, read in the authors' order on every rank: `data/token_files.py`), or MDS folders with their mixture
proportions (`mds_streams`, read by mosaicml-streaming as the authors' Instella-Long runs: `data/mds.py`).

The model comes from `model_name_or_path` (continue from a checkpoint with a new schedule: stage 2)
or from `model_config` (from scratch). Every input check runs before the first step; see docs/pretraining.md.
`PretrainArguments` (transformers' `TrainingArguments` with pretraining's fields) are the settings, `PretrainStage`
the hooks the training lifecycle (`trainer/stage.py`) runs, `main(argv)` parses the recipe and runs the stage.
"""

import hashlib
import importlib
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoConfig, TrainingArguments, default_data_collator

from instella_recipes.core import (
    RecipeError,
    check_range,
    check_training_length,
    exit_on_recipe_error,
    file_digest,
    get_logger,
    parse_recipe,
    setup_logging,
)
from instella_recipes.core.checks import check_model_config
from instella_recipes.core.variables import fill_placeholders
from instella_recipes.data import mds
from instella_recipes.data.integrity import require_verified
from instella_recipes.data.packing import PackedWindows
from instella_recipes.data.token_files import (
    OLMoOrderSampler,
    TokenFiles,
    token_files_from_args,
)
from instella_recipes.data.tokenizer import load_tokenizer
from instella_recipes.pretraining.model_factory import build_model
from instella_recipes.pretraining.pretrain_trainer import FEATURES, NonFiniteCallback, PretrainTrainer
from instella_recipes.trainer.checks import (
    check_global_batch,
    check_tokenizer_fits,
    fit_accumulation,
    readers,
    rows_per_step,
)
from instella_recipes.trainer.features import settings_mixins
from instella_recipes.trainer.features.loss_reduction import loss_reduction_field
from instella_recipes.trainer.features.mds_streams import mds_rows_for
from instella_recipes.trainer.settings import DATA, LAUNCH, RUN, StageSettings
from instella_recipes.trainer.stage import Stage, run_stage

logger = get_logger(__name__)
STAGE = "pretrain"


@dataclass
class PretrainArguments(StageSettings, *settings_mixins(FEATURES), TrainingArguments):
    """The settings of `scripts/pretrain.py`: transformers' `TrainingArguments` (range-checked), the fields of its
    training features (`FEATURES`: the MDS fields `mds_streams`, `data_root`, `num_canonical_nodes`, sequence
    parallelism, the optimizer state, `fsdp_reduce_dtype`, `loss_reduction`) and pretraining's own fields, each with
    its role (`trainer/settings.py`)."""

    # The loss divisor (trainer/features/loss_reduction.py): every input token of the batch (OLMo's `train_step`:
    # `batch['input_ids'].numel()`, instella/train.py:707), or `mean` over the predicted ones (transformers').
    loss_reductions = ("input_tokens", "mean")
    every_token_labelled = True  # pretraining's rows: a label on every input token

    data_dir: str = field(default=None, metadata={"role": DATA, "help": "Output folder of scripts/prepare_data.py."})
    data_paths: list[str] | None = field(
        default=None,
        metadata={
            "role": DATA,
            "help": "Instead of data_dir: OLMo token files (flat uint16), or one .txt with a path a line.",
        },
    )
    seq_len: int | None = field(
        default=None, metadata={"role": RUN, "help": "data_paths: tokens per instance (Instella 4096)."}
    )
    model_name_or_path: str | None = field(
        default=None, metadata={"role": RUN, "help": "Continue from this checkpoint."}
    )
    model_config: dict | str | None = field(
        default=None,
        metadata={"role": RUN, "help": "From scratch: {model_type: instella|llama|zaya|olmoe, <config fields>}."},
    )
    init: str | None = field(default=None, metadata={"role": RUN, "help": "mitchell (Instella), amd_llama, default."})
    tokenizer: str | None = field(
        default=None, metadata={"role": LAUNCH, "help": "Default: the tokenizer saved with the data."}
    )
    global_batch_size: int | None = field(
        default=None, metadata={"role": RUN, "help": "Published global batch (sequences)."}
    )
    fit_global_batch: bool = field(
        default=False,
        metadata={
            "role": RUN,
            "help": "Set gradient_accumulation_steps = global_batch_size / (per_device_train_batch_size x world "
            "size) at start: a job that restarts on fewer or more nodes (sbatch --nodes=12-16) keeps the global "
            "batch.",
        },
    )
    document_masking: bool = field(
        default=False, metadata={"role": RUN, "help": "position_ids restart after each EOS."}
    )
    predict_all_positions: bool = field(
        default=False,
        metadata={
            "role": RUN,
            "help": "Windows of seq_len + 1 tokens, all seq_len inputs predicted (lit_gpt: AMD-Llama-135m).",
        },
    )
    loss_reduction: str = loss_reduction_field("input_tokens")
    max_consecutive_nonfinite: int = field(
        default=5, metadata={"role": RUN, "help": "Stop after this many bad steps in a row."}
    )
    attn_implementation: str | None = field(
        default="sdpa", metadata={"role": RUN, "help": "sdpa, flash_attention_2, flex_attention, flash_or_flex, eager"}
    )
    model_dtype: str | None = field(
        default=None, metadata={"role": RUN, "help": "Parameter dtype (default float32 masters)."}
    )
    plugins: list[str] = field(
        default_factory=list, metadata={"role": RUN, "help": "'package.module:function' import paths."}
    )
    plugin_args: dict | str | None = field(default=None, metadata={"role": RUN, "help": "Passed to every plugin."})
    torch_num_threads: int | None = field(
        default=None,
        metadata={"role": LAUNCH, "help": "CPU runs: intra-op threads (tiny models run faster on 1 thread)."},
    )
    rope_theta: float | None = field(
        default=None,
        metadata={
            "role": RUN,
            "help": "The RoPE base this phase trains at; model_name_or_path must carry it (convert_checkpoint.py "
            "reconfigure), model_config gets it.",
        },
    )

    def __post_init__(self):
        check_range("rope_theta", self.rope_theta, 1, allow_none=True)
        check_range("global_batch_size", self.global_batch_size, 1, integer=True, allow_none=True)
        check_range("seq_len", self.seq_len, 2, integer=True, allow_none=True)
        if self.fit_global_batch and self.global_batch_size is None:
            raise ValueError("fit_global_batch: true needs global_batch_size (the batch to keep)")
        check_range("max_consecutive_nonfinite", self.max_consecutive_nonfinite, 1, integer=True)
        check_range("torch_num_threads", self.torch_num_threads, 1, integer=True, allow_none=True)
        if self.predict_all_positions and self.data_paths:
            raise ValueError(
                "predict_all_positions reads (seq_len + 1)-token windows of a data_dir (lit_gpt's blocks); the token "
                "files of data_paths are read in the authors' seq_len instances: drop one of the two"
            )
        self.model_config = _as_dict(self.model_config, "model_config")
        self.plugin_args = _as_dict(self.plugin_args, "plugin_args") or {}
        if self.model_config and self.rope_theta is not None:
            given = self.model_config.setdefault("rope_theta", self.rope_theta)
            if given != self.rope_theta:
                raise ValueError(f"rope_theta {self.rope_theta} but model_config.rope_theta {given}: keep one")
        if self.model_config:  # a shape that cannot build is named here, before any data or weights are touched
            check_model_config(self.model_config)
        # `output_dir: runs/stage2_{seed}`: the project's one placeholder syntax (as in pipeline YAMLs)
        self.output_dir = fill_placeholders(self.output_dir, {"seed": self.seed}, "output_dir")
        super().__post_init__()


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


def _data_and_tokenizer(script: PretrainArguments, rows_per_step: int):
    given = [name for name in ("data_dir", "data_paths", "mds_streams") if getattr(script, name)]
    if len(given) != 1:
        raise RecipeError(
            "set one of data_dir (the output folder of scripts/prepare_data.py), data_paths (OLMo token files) or "
            f"mds_streams (MDS folders), not {' and '.join(given) if given else 'none'}"
        )
    if script.data_paths:
        return _token_files_and_tokenizer(script)
    if script.mds_streams:
        return _mds_and_tokenizer(script, rows_per_step)
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


def _mds_and_tokenizer(script: PretrainArguments, rows_per_step: int):
    """MDS folders named by `mds_streams`, checked before any work and read as the authors do (`mds_rows_for`)."""
    tok_path = script.tokenizer or script.model_name_or_path
    rows, manifest = mds_rows_for(script, tok_path, script.seq_len, "seq_len", rows_per_step, script.document_masking)
    return rows, manifest, _load_tokenizer(tok_path)


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


def _rope_theta(config) -> float | None:
    """The RoPE base of a config (transformers 5 keeps it in `rope_parameters`; older configs as `rope_theta`)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    return parameters.get("rope_theta", getattr(config, "rope_theta", None))


def _check_rope_theta(args: PretrainArguments, config) -> None:
    """A recipe that states the RoPE base it trains at (`rope_theta`, Instella-Long's phases) and a start checkpoint
    that carries another one: an error, with the command that makes the right start point."""
    if args.rope_theta is None or config is None:
        return
    have = _rope_theta(config)
    if have is not None and float(have) != float(args.rope_theta):
        positions = max(args.seq_len or 0, getattr(config, "max_position_embeddings", 0) or 0)
        raise RecipeError(
            f"rope_theta {args.rope_theta:g} (recipe) but model_name_or_path {args.model_name_or_path} has "
            f"{float(have):g}: make the start point with `python scripts/convert_checkpoint.py reconfigure --input "
            f"{args.model_name_or_path} --output <dir> --rope_theta {args.rope_theta:g} --max_position_embeddings "
            f"{positions}` and train from <dir>"
        )


def _check_fits(config, dataset: PackedWindows | TokenFiles, tokenizer) -> None:
    max_pos = getattr(config, "max_position_embeddings", None)
    if max_pos is not None and dataset.seq_len > max_pos:
        if isinstance(dataset, (TokenFiles, mds.MDSRows)):
            what, fix = f"seq_len {dataset.seq_len} is", f"set seq_len <= {max_pos}"
        else:
            what, fix = f"windows of {dataset.seq_len} tokens are", f"prepare the data with seq_len <= {max_pos}"
        raise RecipeError(f"{what} longer than the model's max_position_embeddings ({max_pos}): {fix}")
    check_tokenizer_fits(config, tokenizer)


def _build_model_and_callbacks(script: PretrainArguments, dataset, tokenizer):
    config = _model_config(script)
    if config is not None:
        _check_fits(config, dataset, tokenizer)
    model = build_model(
        script.model_name_or_path, script.model_config, script.init, script.attn_implementation, script.model_dtype,
        script.seed,
    )  # fmt: skip
    _check_fits(model.config, dataset, tokenizer)
    from transformers.loss.loss_utils import ForCausalLMLoss

    if script.predict_all_positions and model.loss_function is not ForCausalLMLoss:
        raise RecipeError(
            f"predict_all_positions: {type(model).__name__}'s loss is not transformers' ForCausalLMLoss, which reads "
            f"the pre-shifted targets (shift_labels); use a causal LM with the standard loss or drop the option"
        )
    return model, load_plugins(script.plugins, model, script.plugin_args)


def _collator(dataset):
    if isinstance(dataset, mds.MDSRows):
        return dataset.collator
    return TokenFiles.collate if isinstance(dataset, TokenFiles) else default_data_collator


def _olmo_sampler(dataset, train: TrainingArguments) -> OLMoOrderSampler | None:
    """Token files are read in the authors' order (seed = data_seed or seed, as their `data.seed` or `seed`)."""
    if not isinstance(dataset, TokenFiles):
        return None
    global_batch = rows_per_step(train)  # an SP group reads one row: the readers are the world over the SP size
    seed = train.data_seed if train.data_seed is not None else train.seed
    sampler = OLMoOrderSampler(len(dataset), global_batch, train.per_device_train_batch_size, readers(train), seed)
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


@dataclass
class PretrainData:
    """What `load_data` hands on: the windows or token files, the data's manifest (its fingerprint), the tokenizer."""

    dataset: PackedWindows | TokenFiles
    manifest: dict
    tokenizer: object


class PretrainStage(Stage):
    """Pretraining in the training lifecycle (`trainer/stage.py`): packed windows or token files, a model from a
    config or a checkpoint with its plugins, `PretrainTrainer` with the non-finite-step guard, and beside the final
    model the AdamW state when asked for."""

    name = STAGE
    features = FEATURES
    settings_class = PretrainArguments
    trainer_class = PretrainTrainer

    def __init__(self, args: PretrainArguments, argv: list[str] | None = None):
        super().__init__(args, None, argv)
        self.optimizer_state = None  # set by the optimizer-state feature's check
        self.input_config = None  # the start checkpoint's or model_config's config, when `check` can read it
        self.plugin_callbacks: list = []
        self.nonfinite = None
        self.use_cache = None

    def inputs(self) -> list[tuple[str, str]]:
        return [
            ("data_dir", self.args.data_dir),
            ("model_name_or_path", self.args.model_name_or_path),
            ("optimizer_state_from", self.args.optimizer_state_from),
        ]

    def row_length(self, data: "PretrainData | None" = None) -> tuple[int | None, str]:
        """The rows' tokens: the data's (a data_dir fixes it), else the recipe's `seq_len`."""
        return (data.dataset.seq_len if data is not None else self.args.seq_len), "seq_len"

    def check(self) -> None:
        args = self.args
        if args.torch_num_threads:
            torch.set_num_threads(args.torch_num_threads)
        # the start checkpoint's config only (no weights); a missing one is reported where the model loads. The
        # sequence-parallel feature checks the model's heads against it next, before any data or weights are read.
        has_config = args.model_name_or_path and (Path(args.model_name_or_path) / "config.json").is_file()
        self.input_config = _model_config(args) if has_config or args.model_config else None
        _check_rope_theta(args, self.input_config)
        if args.fit_global_batch:
            args.gradient_accumulation_steps = fit_accumulation(
                args.global_batch_size, args.per_device_train_batch_size, readers(args)
            )

    def load_data(self) -> PretrainData:
        args = self.args
        global_batch = rows_per_step(args)
        dataset, data_manifest, tokenizer = _data_and_tokenizer(args, global_batch)
        check_training_length(args.max_steps, args.num_train_epochs, len(dataset), global_batch, "windows of data_dir")
        if args.global_batch_size is not None:
            check_global_batch(
                args.global_batch_size, args.per_device_train_batch_size, args.gradient_accumulation_steps,
                readers(args),
            )  # fmt: skip
        return PretrainData(dataset, data_manifest, tokenizer)

    def data_fingerprint(self, data: PretrainData) -> str | None:
        return data.manifest.get("fingerprint")

    def data_files(self, data: PretrainData) -> list | None:
        return data.manifest.get("files")

    def build_model(self, data: PretrainData):
        model, self.plugin_callbacks = _build_model_and_callbacks(self.args, data.dataset, data.tokenizer)
        # Training needs no KV cache, and transformers derives the per-document mask from position_ids
        # (document_masking) only when no cache is passed; the saved config gets use_cache back (`before_save`).
        self.use_cache = getattr(model.config, "use_cache", None)
        model.config.use_cache = False
        return model

    def build_trainer(self, data: PretrainData, model, callbacks: list):
        args, dataset = self.args, data.dataset
        trainer = PretrainTrainer(
            model=model,
            args=args,
            train_dataset=dataset.dataset if isinstance(dataset, mds.MDSRows) else dataset,
            data_collator=_collator(dataset),
            processing_class=data.tokenizer,
            callbacks=[*callbacks, *self.plugin_callbacks],
            train_sampler=_olmo_sampler(dataset, args),
            **self.feature_kwargs(data, model),
        )
        self.nonfinite = NonFiniteCallback(trainer, args.max_consecutive_nonfinite)
        trainer.add_callback(self.nonfinite)
        return trainer

    def after_train(self, trainer) -> None:
        nonfinite = self.nonfinite
        if nonfinite.diverged_at is not None:
            _report_divergence(self.args, trainer, nonfinite, self.output_dir)
        if nonfinite.all_skipped():
            logger.error(
                f"every one of the {trainer.state.global_step - nonfinite.start_step} steps of this run was skipped "
                f"(non-finite loss or gradients): nothing was trained and no final model or manifest was written. "
                f"Check the input weights and the data, or lower the learning rate."
            )
            raise SystemExit(3)

    def before_save(self, trainer) -> None:
        trainer.restore_attention()  # the saved model runs its own attention, not the SP wrapper
        if self.use_cache is not None:
            trainer.accelerator.unwrap_model(trainer.model).config.use_cache = self.use_cache

    def manifest_fields(self, trainer, data: PretrainData) -> dict:
        args = self.args
        global_batch = rows_per_step(args)
        return {
            "data_dir": str(args.data_dir) if args.data_dir else None,
            "data_paths": args.data_paths,
            "mds_streams": args.mds_streams,
            "data_root": args.data_root,
            "data_fingerprint": data.manifest.get("fingerprint"),
            "skipped_steps": trainer.skipped_steps,
            "tokens_seen": trainer.state.global_step * global_batch * data.dataset.seq_len,
        }


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/pretrain.py`: parse the recipe and the command line, then run the pretraining stage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    (args,) = parse_recipe([PretrainArguments], argv)
    setup_logging()
    return run_stage(PretrainStage(args, argv))
