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

from trl import SFTConfig, SFTTrainer

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.core.checks import check_choice
from instella_recipes.trainer.mixed_precision import FSDPReduceDtypeMixin
from instella_recipes.trainer.optim import InstellaOptimMixin
from instella_recipes.trainer.settings import RUN
from instella_recipes.trainer.stage import run_stage

from .run import CheckedModelConfig, PostTrainingSettings, PostTrainingStage
from .tokenization import check_truncation_mode, prepare_sft_dataset


@dataclass
class CheckedSFTConfig(PostTrainingSettings, SFTConfig):
    """SFT's settings: TRL's SFTConfig, its numeric fields range-checked at parse time (`core.checks`: without it SFT
    `max_length -1` silently drops every row's closing EOS label), with the post-training fields and the FSDP reduce
    dtype."""

    fsdp_reduce_dtype: str | None = field(
        default="float32",
        metadata={"role": RUN, "help": "FSDP with bf16: gradient reduce dtype (authors: float32); null: bf16."},
    )

    def __post_init__(self):
        if self.fsdp_reduce_dtype is not None:
            check_choice("fsdp_reduce_dtype", self.fsdp_reduce_dtype, ("float32", "bfloat16"))
        check_truncation_mode(self.truncation_mode)
        super().__post_init__()


class InstellaSFTTrainer(FSDPReduceDtypeMixin, InstellaOptimMixin, SFTTrainer):
    """SFTTrainer with Instella's optimizer settings and LR schedule, and under FSDP + bf16 the gradients reduced in
    fp32 (the authors' `fsdp.precision: mixed`)."""

    def __init__(self, *args, fsdp_reduce_dtype: str | None = "float32", **kwargs):
        self.fsdp_reduce_dtype = fsdp_reduce_dtype
        super().__init__(*args, **kwargs)


class SFTStage(PostTrainingStage):
    """SFT in the training lifecycle: the mixture as chats with assistant-only labels, `InstellaSFTTrainer`."""

    name = "sft"
    trainer_class = InstellaSFTTrainer

    def check(self) -> None:
        if self.args.assistant_only_loss or self.args.completion_only_loss:
            raise RecipeError(
                "remove assistant_only_loss / completion_only_loss: this recipe already builds assistant-only labels "
                "from the Instella chat template (see instella_recipes/post_training/template.py)"
            )
        super().check()

    def prepare(self, mixture, tokenizer):
        args = self.args
        return prepare_sft_dataset(mixture, tokenizer, args.max_length, args.overlong, args.dataset_num_proc)

    def trainer_kwargs(self) -> dict:
        return {"fsdp_reduce_dtype": self.args.fsdp_reduce_dtype}


def build_trainer(training_args, model_args, callbacks=()):
    """Everything up to a ready trainer (data checked first), for tests and tools: (trainer, data)."""
    return SFTStage(training_args, model_args).build(callbacks)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/sft.py`: parse the recipe and the command line, then one whole SFT run (exit code 0)."""
    training_args, model_args = parse_recipe([CheckedSFTConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_stage(SFTStage(training_args, model_args, argv))
