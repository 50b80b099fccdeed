"""Supervised fine-tuning (Instella-3B -> Instella-3B-SFT) with TRL's SFTTrainer: the stage's settings, its Trainer
subclass and `main(argv)` (`scripts/sft.py` is the command line).

The recipe parses into `CheckedSFTConfig` (TRL's SFTConfig, range-checked, with our fields) and `CheckedModelConfig`
(TRL's ModelConfig: input model, LoRA); `SFTStage` is the stage in the training lifecycle (`trainer/stage.py`). The
data mixture is converted to `messages`, checked and tokenized (`tokenization.prepare_sft_dataset`) with the Instella
chat template and assistant-only labels (assistant content + its EOS), then handed to SFTTrainer pre-tokenized; TRL
pads (one example per row, `pad_to_multiple_of: max_length` as published) or packs padding-free (`packing: true`).
Instead of `sources`, `mds_streams` reads the authors' packed MDS rows (Instella-Long SFT: `sft/` of
amd/Instella-Long) with mosaicml-streaming as pretraining does (`trainer/mds_streams.py`, `data/mds.py`): each row as
their collator cuts it at `max_length`, `position_ids` restarting per document span, labels = the input ids with
`label_mask` applied where the row has one, handed to SFTTrainer already tokenised (`skip_prepare_dataset`). The
OLMo schedule and all-parameter weight decay come from `InstellaOptimMixin`. The output folder gets the model, the
tokenizer with the chat template, trainer_state.json, data_report.json and manifest.json (last); what DPO shares is in
`run.py`.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import AutoConfig
from trl import SFTConfig, SFTTrainer

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.core.checks import check_choice
from instella_recipes.data import mds
from instella_recipes.trainer.checks import check_fits_positions
from instella_recipes.trainer.mds_streams import (
    MDSStreamsArguments,
    StreamingRowsMixin,
    check_mds_lengths,
    mds_rows_for,
)
from instella_recipes.trainer.mixed_precision import FSDPReduceDtypeMixin
from instella_recipes.trainer.optim import InstellaOptimMixin
from instella_recipes.trainer.optimizer_state import OPTIMIZER_DIR, ContinueOptimizerStateMixin, check_optimizer_state
from instella_recipes.trainer.sequence_parallel import (
    SequenceParallelArguments,
    SequenceParallelMixin,
    check_sequence_parallel,
    sequence_parallel_for,
)
from instella_recipes.trainer.settings import RUN
from instella_recipes.trainer.stage import run_stage

from .loss import LOSS_REDUCTION_HELP, RETIRED_KEYS, LossReductionMixin, check_loss_reduction
from .run import (
    CheckedModelConfig,
    PostTrainingData,
    PostTrainingSettings,
    PostTrainingStage,
    check_rope_theta,
    load_tokenizer_with_template,
    readers,
)
from .tokenization import check_row_format, check_truncation_mode, prepare_sft_dataset


@dataclass
class CheckedSFTConfig(PostTrainingSettings, MDSStreamsArguments, SequenceParallelArguments, SFTConfig):
    """SFT's settings: TRL's SFTConfig, its numeric fields range-checked at parse time (`core.checks`: without it SFT
    `max_length -1` silently drops every row's closing EOS label), with the post-training fields, the FSDP reduce
    dtype, the row format, the loss reduction (`loss.py`) and the MDS fields (`mds_streams`: the authors' packed rows
    instead of `sources`)."""

    retired_keys = RETIRED_KEYS  # core.recipe: a recipe that still has one gets what to write instead

    fsdp_reduce_dtype: str | None = field(
        default="float32",
        metadata={"role": RUN, "help": "FSDP with bf16: gradient reduce dtype (authors: float32); null: bf16."},
    )
    row_format: str = field(
        default="instella",
        metadata={
            "role": RUN,
            "help": "instella (prepare_sft_data.py rows) | open_instruct (finetune.py encode_sft_example).",
        },
    )
    loss_reduction: str = field(default="mean", metadata={"role": RUN, "help": LOSS_REDUCTION_HELP})
    rope_theta: float | None = field(
        default=None, metadata={"role": RUN, "help": "The RoPE base the input model must carry (long-context SFT)."}
    )
    max_length_beyond_positions: bool = field(
        default=False,
        metadata={
            "role": RUN,
            "help": "Train rows longer than the model's max_position_embeddings on purpose (Instella-Math SFT-2: "
            "32K on the 4K model, as the authors); else such a max_length is an error.",
        },
    )
    optimizer_state_from: str | None = field(
        default=None,
        metadata={
            "role": RUN,
            "help": "Start AdamW from <this run>/optimizer_state/ (Instella-Long SFT: phase 2's moments; new step "
            "counter and schedule).",
        },
    )

    def __post_init__(self):
        if self.fsdp_reduce_dtype is not None:
            check_choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, ("float32", "bfloat16"))
        check_row_format(self.row_format)
        check_loss_reduction(self.loss_reduction, self.average_tokens_across_devices)
        check_truncation_mode(self.truncation_mode)
        super().__post_init__()


class InstellaSFTTrainer(
    StreamingRowsMixin,
    SequenceParallelMixin,
    ContinueOptimizerStateMixin,
    FSDPReduceDtypeMixin,
    InstellaOptimMixin,
    LossReductionMixin,
    SFTTrainer,
):
    """SFTTrainer with Instella's optimizer settings and LR schedule, under FSDP + bf16 the gradients reduced in
    fp32 (the authors' `fsdp.precision: mixed`), Ulysses sequence parallelism (`sequence_parallel=`), another
    run's AdamW moments (`optimizer_state_from=`), the loss reduction of `loss.py` and streaming's MDS rows read
    as they are split (`streaming_rows=`)."""

    def __init__(self, *args, fsdp_reduce_dtype: str | None = "float32", **kwargs):
        self.fsdp_reduce_dtype = fsdp_reduce_dtype
        super().__init__(*args, **kwargs)


class SFTStage(PostTrainingStage):
    """SFT in the training lifecycle: the mixture as chats with assistant-only labels, `InstellaSFTTrainer`."""

    name = "sft"
    trainer_class = InstellaSFTTrainer

    sequence_parallel = None
    optimizer_state = None
    mds_rows = None  # mds_streams: the MDSRows behind the dataset (`load_data`)

    def inputs(self) -> list[tuple[str, str]]:
        return [*super().inputs(), ("optimizer_state_from", self.args.optimizer_state_from)]

    def check(self) -> None:
        if self.args.assistant_only_loss or self.args.completion_only_loss:
            raise RecipeError(
                "remove assistant_only_loss / completion_only_loss: this recipe already builds assistant-only labels "
                "from the Instella chat template (see instella_recipes/post_training/template.py)"
            )
        if self.args.mds_streams:
            _check_mds_settings(self.args)
        _check_sequence_parallel_rows(self.args)
        super().check()
        if self.args.optimizer_state_from and self.model_args.use_peft:
            raise RecipeError("optimizer_state_from continues a full model's AdamW state: not with LoRA (use_peft)")
        if self.args.optimizer_state_from:
            folder = Path(self.args.optimizer_state_from) / OPTIMIZER_DIR
            self.optimizer_state = check_optimizer_state(folder, "optimizer_state_from")
        path = Path(self.model_args.model_name_or_path or "")
        if (path / "config.json").is_file():  # the config only, before any work
            config = AutoConfig.from_pretrained(path, trust_remote_code=True)
            if self.args.rope_theta is not None:
                check_rope_theta(self.args.rope_theta, config, self.model_args.model_name_or_path)
            if self.args.max_length is not None and not self.args.max_length_beyond_positions:
                fix = "lower --max_length (or set max_length_beyond_positions: true to train past them on purpose)"
                default = next(f.default for f in fields(SFTConfig) if f.name == "max_length")
                unset = " (TRL's default: the recipe sets none)" if self.args.max_length == default else ""
                check_fits_positions(config, self.args.max_length, f"max_length {self.args.max_length}{unset}", fix)

    def load_data(self) -> PostTrainingData:
        """The chat mixture (`sources`), or with `mds_streams` the authors' packed MDS rows: checked before any work,
        `max_steps` x the global batch rows (streaming's epoch), given to SFTTrainer as they are."""
        args = self.args
        if not args.mds_streams:
            return super().load_data()
        per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps * readers(args)
        self.mds_rows, manifest = mds_rows_for(
            args, args.tokenizer_name_or_path or self.model_args.model_name_or_path, args.max_length, "max_length",
            per_step, document_masking=True,
        )  # fmt: skip
        tokenizer = load_tokenizer_with_template(args, self.model_args)  # after the folders' tokenizer check
        args.dataset_kwargs = {**(args.dataset_kwargs or {}), "skip_prepare_dataset": True}  # tokenised and packed
        summary = (
            f"mds_streams: {len(self.mds_rows)} rows ({args.max_steps} steps x {per_step}) from "
            f"{', '.join(args.mds_streams)}, cut at {args.max_length} tokens"
        )
        report = {"mds_streams": list(args.mds_streams), "data_fingerprint": manifest["fingerprint"],
                  "data_files": manifest["files"], "rows": len(self.mds_rows), "summary": summary}  # fmt: skip
        return PostTrainingData(tokenizer, self.mds_rows.iterable_dataset(), report)

    def data_fingerprint(self, data: PostTrainingData | None) -> str | None:
        """mds_streams: the folders, proportions and index digests; a chat mixture: None (its `data` fields)."""
        return data.report.get("data_fingerprint") if data is not None else None

    def data_files(self, data: PostTrainingData | None) -> list | None:
        """mds_streams: the shards (to name a changed one); a chat mixture: its source files (`Stage`)."""
        files = data.report.get("data_files") if data is not None else None
        return files if files is not None else super().data_files(data)

    def build_trainer(self, data, model, callbacks: list):
        self.sequence_parallel = sequence_parallel_for(self.args, self.args, model.config, None)
        if self.mds_rows is None and self.args.padding_free and not self.args.packing:
            return self._padding_free_trainer(data, model, callbacks)
        if self.mds_rows is None:
            return super().build_trainer(data, model, callbacks)
        with self.mds_rows.previewing():  # SFTTrainer reads one row when built: not streaming's epoch (mds.py)
            return super().build_trainer(data, model, callbacks)

    def _padding_free_trainer(self, data, model, callbacks: list):
        """`padding_free` without `packing`: each batch flattened into one row, documents told apart by position_ids.
        TRL refuses a `max_length` there because it would not enforce it ("provide already truncated inputs, or set
        max_length=None"); `prepare` has cut every row at `max_length` already (`overlong`), so SFTTrainer is built
        with none and the setting is restored for the run's records."""
        max_length, self.args.max_length = self.args.max_length, None
        try:
            return super().build_trainer(data, model, callbacks)
        finally:
            self.args.max_length = max_length

    def before_save(self, trainer) -> None:
        trainer.restore_attention()  # the saved model runs its own attention, not the SP wrapper

    def prepare(self, mixture, tokenizer):
        args = self.args
        return prepare_sft_dataset(
            mixture, tokenizer, args.max_length, args.overlong, args.dataset_num_proc, row_format=args.row_format
        )

    def trainer_kwargs(self) -> dict:
        mds_kwargs = {"data_collator": mds.stack_rows, "streaming_rows": True} if self.mds_rows is not None else {}
        return {
            "fsdp_reduce_dtype": self.args.fsdp_reduce_dtype,
            "sequence_parallel": self.sequence_parallel,
            "optimizer_state_from": self.optimizer_state,
            "loss_reduction": self.args.loss_reduction,
            **mds_kwargs,
        }


def _check_mds_settings(args) -> None:
    """`mds_streams` reads rows that are tokenised, packed and labelled already: no chat data beside them, nothing
    that would pack or cap them again."""
    if args.sources:
        raise RecipeError(
            "set sources (chat data, tokenised here) or mds_streams (the authors' packed MDS rows), not both"
        )
    if args.packing or args.padding_free:
        raise RecipeError(
            "mds_streams rows are packed already (document spans -> position_ids): set packing: false and "
            "padding_free: false"
        )
    if args.max_samples is not None:
        raise RecipeError("max_samples caps a chat mixture; mds_streams reads max_steps x the global batch rows")
    check_mds_lengths(args, args.max_length, "max_length")


def _check_sequence_parallel_rows(args) -> None:
    """SP takes padding-free rows (documents told apart by position_ids) whose length the SP size divides."""
    size = args.sequence_parallel_size
    if size == 1:
        return
    if args.mds_streams:  # packed rows of up to max_length tokens, cut as the authors' (who assert the same)
        if args.max_length is not None and args.max_length % size:
            raise RecipeError(
                f"max_length {args.max_length} is not divisible by sequence_parallel_size {size}: each rank keeps "
                f"an equal chunk of a row; choose a multiple of {size}"
            )
    elif not (args.packing or args.padding_free):
        raise RecipeError(
            f"sequence_parallel_size {size} takes padding-free rows: set packing: true (or padding_free: true)"
        )
    elif not args.pad_to_multiple_of or args.pad_to_multiple_of % size:
        raise RecipeError(
            f"sequence_parallel_size {size}: every row must split into {size} equal chunks; set pad_to_multiple_of "
            f"to a multiple of {size} (now {args.pad_to_multiple_of})"
        )
    try:
        check_sequence_parallel(size, None, args.world_size, None, args.per_device_train_batch_size)
    except ValueError as err:
        raise RecipeError(str(err)) from None


def build_trainer(training_args, model_args, callbacks=()):
    """Everything up to a ready trainer (data checked first), for tests and tools: (trainer, data)."""
    return SFTStage(training_args, model_args).build(callbacks)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/sft.py`: parse the recipe and the command line, then one whole SFT run (exit code 0)."""
    training_args, model_args = parse_recipe([CheckedSFTConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_stage(SFTStage(training_args, model_args, argv))
