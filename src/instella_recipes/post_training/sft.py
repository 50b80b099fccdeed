"""Supervised fine-tuning (Instella-3B -> Instella-3B-SFT) with TRL's SFTTrainer: the stage's settings, its Trainer
subclass and `main(argv)` (`scripts/sft.py` is the command line).

The recipe parses into `CheckedSFTConfig` (TRL's SFTConfig, range-checked, with our fields) and `CheckedModelConfig`
(TRL's ModelConfig: input model, LoRA); `SFTStage` is the stage in the training lifecycle (`trainer/stage.py`). The
data mixture is converted to `messages`, checked and tokenized (`tokenization.prepare_sft_dataset`) with the Instella
chat template and assistant-only labels (assistant content + its EOS), then handed to SFTTrainer pre-tokenized; TRL
pads (one example per row, `pad_to_multiple_of: max_length` as published) or packs padding-free (`packing: true`).
Instead of `sources`, `mds_streams` reads the authors' packed MDS rows (Instella-Long SFT: `sft/` of amd/Instella-Long)
with mosaicml-streaming as pretraining does (`trainer/features/mds_streams.py`, `data/mds.py`): each row as their
collator cuts it at `max_length`, `position_ids` restarting per document span, labels = the input ids with `label_mask`
applied where the row has one, handed to SFTTrainer already tokenised (`skip_prepare_dataset`). The training features
(`FEATURES`: MDS streaming, sequence parallelism, another run's AdamW state, the fp32 reduce, the OLMo schedule with
all-parameter weight decay, the loss reduction) are `trainer/features/`'s. The output folder gets the model, the
tokenizer with the chat template, trainer_state.json, data_report.json and manifest.json (last); what DPO shares is in
`shared.py`.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path

from transformers import AutoConfig
from trl import SFTConfig, SFTTrainer

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.data import mds
from instella_recipes.trainer.checks import check_fits_positions, rows_per_step
from instella_recipes.trainer.features import (
    fp32_reduce,
    loss_reduction,
    mds_streams,
    optimizer,
    optimizer_state,
    sequence_parallel,
    settings_mixins,
    trainer_mixins,
)
from instella_recipes.trainer.features.mds_streams import check_mds_lengths, mds_rows_for
from instella_recipes.trainer.settings import RUN
from instella_recipes.trainer.stage import run_stage

from .shared import (
    CheckedModelConfig,
    PostTrainingData,
    PostTrainingSettings,
    PostTrainingStage,
    check_rope_theta,
    load_tokenizer_with_template,
)
from .tokenization import check_row_format, check_truncation_mode, prepare_sft_dataset

# SFT's training features, in order (the first is the outermost Trainer mixin); `CheckedSFTConfig`,
# `InstellaSFTTrainer` and `SFTStage` all derive from this one tuple.
FEATURES = (
    mds_streams.FEATURE,
    sequence_parallel.FEATURE,
    optimizer_state.FEATURE,
    fp32_reduce.FEATURE,
    optimizer.FEATURE,
    loss_reduction.FEATURE,
)


@dataclass
class CheckedSFTConfig(PostTrainingSettings, *settings_mixins(FEATURES), SFTConfig):
    """SFT's settings: TRL's SFTConfig, its numeric fields range-checked at parse time (`core.checks`: without it SFT
    `max_length -1` silently drops every row's closing EOS label), with the post-training fields, the fields of its
    training features (`FEATURES`: the MDS fields, `mds_streams` being the authors' packed rows instead of `sources`;
    sequence parallelism; the optimizer state; `fsdp_reduce_dtype`; `loss_reduction`) and the row format."""

    library_roles = dict.fromkeys(("max_length", "packing", "loss_type"), RUN)  # SFTConfig's run-defining fields

    row_format: str = field(
        default="instella",
        metadata={
            "role": RUN,
            "help": "instella (prepare_sft_data.py rows) | open_instruct (finetune.py encode_sft_example).",
        },
    )
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

    def __post_init__(self):
        check_row_format(self.row_format)
        check_truncation_mode(self.truncation_mode)
        super().__post_init__()


class InstellaSFTTrainer(*trainer_mixins(FEATURES), SFTTrainer):
    """SFTTrainer with SFT's training features (`FEATURES`): streaming's MDS rows read as they are split
    (`streaming_rows=`), Ulysses sequence parallelism (`sequence_parallel=`), another run's AdamW moments
    (`optimizer_state_from=`), under FSDP + bf16 the gradients reduced in fp32 (the authors' `fsdp.precision: mixed`),
    Instella's optimizer settings and LR schedule, and the loss reduction."""


class SFTStage(PostTrainingStage):
    """SFT in the training lifecycle: the mixture as chats with assistant-only labels, `InstellaSFTTrainer`."""

    name = "sft"
    features = FEATURES
    settings_class = CheckedSFTConfig
    trainer_class = InstellaSFTTrainer

    optimizer_state = None  # set by the optimizer-state feature's check
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
        per_step = rows_per_step(args)
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

    def row_length(self, data=None) -> tuple[int | None, str]:
        """MDS rows are cut at `max_length`; chat rows are padded to a multiple of `pad_to_multiple_of`."""
        if self.args.mds_streams:
            return self.args.max_length, "max_length"
        return self.args.pad_to_multiple_of, "pad_to_multiple_of"

    def build_trainer(self, data, model, callbacks: list):
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
        return {"data_collator": mds.stack_rows} if self.mds_rows is not None else {}


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
    """SP takes padding-free rows (documents told apart by position_ids); their length is checked by the
    sequence-parallel feature (`SFTStage.row_length`): MDS rows are cut at max_length (as the authors', who assert the
    same), chat rows padded to a multiple of pad_to_multiple_of, which must be set."""
    size = args.sequence_parallel_size
    if size == 1 or args.mds_streams:
        return
    if not (args.packing or args.padding_free):
        raise RecipeError(
            f"sequence_parallel_size {size} takes padding-free rows: set packing: true (or padding_free: true)"
        )
    if not args.pad_to_multiple_of:
        raise RecipeError(
            f"sequence_parallel_size {size}: every row must split into {size} equal chunks; set pad_to_multiple_of "
            f"to a multiple of {size}"
        )


def build_trainer(training_args, model_args, callbacks=()):
    """Everything up to a ready trainer (data checked first), for tests and tools: (trainer, data)."""
    return SFTStage(training_args, model_args).build(callbacks)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/sft.py`: parse the recipe and the command line, then one whole SFT run (exit code 0)."""
    training_args, model_args = parse_recipe([CheckedSFTConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_stage(SFTStage(training_args, model_args, argv))
