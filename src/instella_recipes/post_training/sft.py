"""Supervised fine-tuning (Instella-3B -> Instella-3B-SFT) with TRL's SFTTrainer: the stage's settings, its Trainer
subclass and `main(argv)` (`scripts/sft.py` is the command line).

The recipe parses into `SFTArguments` (our fields), `CheckedSFTConfig` (TRL's SFTConfig, range-checked) and
`CheckedModelConfig` (TRL's ModelConfig: input model, LoRA). The data mixture is converted to `messages`, checked and
tokenized (`tokenization.prepare_sft_dataset`) with the Instella chat template and assistant-only labels (assistant
content + its EOS), then handed to SFTTrainer pre-tokenized; TRL pads (one example per row,
`pad_to_multiple_of: max_length` as published) or packs padding-free (`packing: true`). The OLMo schedule and
all-parameter weight decay come from `InstellaOptimMixin`. The output folder gets the model, the tokenizer with the
chat template, trainer_state.json, data_report.json and manifest.json (last); what DPO shares is in `run.py`.
"""

from dataclasses import dataclass, field
from functools import partial

from trl import SFTConfig, SFTTrainer

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.core.checks import check_choice, check_training_arguments
from instella_recipes.trainer.mixed_precision import FSDPReduceDtypeMixin
from instella_recipes.trainer.optim import InstellaOptimMixin

from .loss import LossReductionMixin, check_loss_reduction
from .run import CheckedModelConfig, PostTrainingArguments, build_trainer_for, run_post_training
from .tokenization import check_row_format, check_truncation_mode, prepare_sft_dataset


@dataclass
class SFTArguments(PostTrainingArguments):
    """SFT's recipe fields beyond TRL's SFTConfig and ModelConfig: the shared ones, the FSDP reduce dtype, the row
    format and the loss reduction."""

    fsdp_reduce_dtype: str | None = field(
        default="float32", metadata={"help": "FSDP with bf16: gradient reduce dtype (authors: float32); null: bf16."}
    )
    row_format: str = field(
        default="instella",
        metadata={"help": "instella (prepare_sft_data.py rows) | open_instruct (finetune.py encode_sft_example)."},
    )
    loss_reduction: str = field(
        default="mean", metadata={"help": "mean (label-token mean) | sum (open-instruct reduce_loss: sum)."}
    )

    def __post_init__(self):
        super().__post_init__()
        if self.fsdp_reduce_dtype is not None:
            check_choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, ("float32", "bfloat16"))
        check_row_format(self.row_format)
        check_loss_reduction(self.loss_reduction, average_tokens_across_devices=False)


@dataclass
class CheckedSFTConfig(SFTConfig):
    """TRL's SFTConfig with its numeric fields range-checked at parse time (`core.checks`): without it SFT
    `max_length -1` silently drops every row's closing EOS label."""

    def __post_init__(self):
        check_training_arguments(self)
        check_truncation_mode(self.truncation_mode)
        super().__post_init__()


class InstellaSFTTrainer(FSDPReduceDtypeMixin, InstellaOptimMixin, LossReductionMixin, SFTTrainer):
    """SFTTrainer with Instella's optimizer settings and LR schedule, under FSDP + bf16 the gradients reduced in
    fp32 (the authors' `fsdp.precision: mixed`), and the loss reduction of `loss.py`."""

    def __init__(self, *args, fsdp_reduce_dtype: str | None = "float32", **kwargs):
        self.fsdp_reduce_dtype = fsdp_reduce_dtype
        super().__init__(*args, **kwargs)


def build_trainer(args: SFTArguments, training_args, model_args, preemption=None):
    """Everything up to a ready trainer (data checked first); returns (trainer, data report dict)."""
    if training_args.assistant_only_loss or training_args.completion_only_loss:
        raise RecipeError(
            "remove assistant_only_loss / completion_only_loss: this recipe already builds assistant-only labels "
            "from the Instella chat template (see instella_recipes/post_training/template.py)"
        )
    check_loss_reduction(args.loss_reduction, training_args.average_tokens_across_devices)
    return build_trainer_for(
        InstellaSFTTrainer, partial(prepare_sft_dataset, row_format=args.row_format), args, training_args,
        model_args, preemption,
        trainer_kwargs={"fsdp_reduce_dtype": args.fsdp_reduce_dtype, "loss_reduction": args.loss_reduction},
    )  # fmt: skip


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/sft.py`: parse the recipe and the command line, then one whole SFT run (exit code 0)."""
    args, training_args, model_args = parse_recipe([SFTArguments, CheckedSFTConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_post_training(build_trainer, args, training_args, model_args, argv, "sft")
