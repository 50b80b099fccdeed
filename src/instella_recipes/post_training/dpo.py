"""Preference tuning (Instella-3B-SFT -> Instella-3B-Instruct) with TRL's DPOTrainer and length-normalised DPO: the
stage's settings, its Trainer subclass and `main(argv)` (`scripts/dpo.py` is the command line).

The recipe parses into `CheckedDPOConfig` (TRL's DPOConfig, range-checked, loss names checked, with our fields) and
`CheckedModelConfig` (TRL's ModelConfig: input model, LoRA); `DPOStage` is the stage in the training lifecycle. The
pairs are tokenized as the authors' `dpo_tune.py` (open-instruct) does: each whole conversation at once, every
assistant turn scored, prompt/completion cut where their prefix tokenization puts it
(`tokenization.prepare_dpo_dataset`, `preference.py`); TRL's trainer gets them pre-tokenized with a per-token score
mask, so its own preparation (which scores only the last turn) is skipped. The authors' `dpo_norm` (policy and
reference log-probabilities averaged over the scored tokens instead of summed, then the sigmoid DPO loss) is exactly
TRL 1.16's `loss_type: sigmoid_norm`: it divides each summed log-ratio by its mask's token count before
`-logsigmoid(beta * (chosen - rejected))`; the recipe accepts `dpo_norm` as a name for it. (TRL's logged `rewards/*`
stay beta x the *summed* log-ratios.) `precompute_ref_log_probs: true` computes the reference log-probs once before
training (no reference model in memory during training). What SFT shares is in `shared.py`. DPO's training features
(`FEATURES`): Instella's optimizer and the fp32 gradient reduce, which every training stage carries; not sequence
parallelism, MDS streaming, optimizer-state continuation or the loss reduction (the authors' DPO has none of them, and
TRL's DPO loss is a mean over pairs, not a token sum to divide).
"""

import re
from dataclasses import dataclass, fields

from trl import DPOConfig, DPOTrainer

from instella_recipes.core import exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.core.checks import check_choice
from instella_recipes.trainer.features import fp32_reduce, optimizer, settings_mixins, trainer_mixins
from instella_recipes.trainer.settings import RUN
from instella_recipes.trainer.stage import run_stage

from .preference import SCORED_COLUMNS, DataCollatorForScoredPreference
from .shared import CheckedModelConfig, PostTrainingSettings, PostTrainingStage
from .tokenization import check_truncation_mode, prepare_dpo_dataset

# DPO's training features, in order; `CheckedDPOConfig`, `InstellaDPOTrainer` and `DPOStage` derive from this tuple.
FEATURES = (fp32_reduce.FEATURE, optimizer.FEATURE)
# Our recipe names for TRL's losses (SPEC: Instella's DPO is `dpo_norm`).
LOSS_ALIASES = {"dpo_norm": "sigmoid_norm", "dpo": "sigmoid"}


def dpo_loss_types() -> list[str] | None:
    """The loss names TRL's DPOConfig documents, plus our aliases. TRL keeps no list of them in code (its trainer
    branches on the names), so they are read from the field's help text; None if that text names none (a TRL
    version that words it differently), and the check is then left to TRL."""
    help_text = next(f for f in fields(DPOConfig) if f.name == "loss_type").metadata.get("help", "")
    names = set(re.findall(r"`'(\w+)'`", help_text))
    return sorted(names | set(LOSS_ALIASES)) if names else None


@dataclass
class CheckedDPOConfig(PostTrainingSettings, *settings_mixins(FEATURES), DPOConfig):
    """DPO's settings: TRL's DPOConfig with the post-training fields, its numeric fields range-checked and `loss_type`
    checked at parse time: without it `beta -5` trains towards the rejected answers and an unknown loss fails only
    after the model and data load."""

    library_roles = dict.fromkeys(("max_length", "beta", "loss_type"), RUN)  # DPOConfig's fields that define the run

    def __post_init__(self):
        check_truncation_mode(self.truncation_mode)
        known = dpo_loss_types()
        for name in ([self.loss_type] if isinstance(self.loss_type, str) else self.loss_type) if known else []:
            check_choice("loss_type", name, known)
        super().__post_init__()


class InstellaDPOTrainer(*trainer_mixins(FEATURES), DPOTrainer):
    """DPOTrainer with DPO's training features (weight decay applies to all parameters when set; the fp32 reduce under
    FSDP + bf16), fed rows from `prepare_dpo_dataset` (whole conversations + score masks) through
    `DataCollatorForScoredPreference`."""

    def __init__(self, *args, data_collator=None, **kwargs):
        if data_collator is None:
            training_args, tokenizer = kwargs["args"], kwargs["processing_class"]
            data_collator = DataCollatorForScoredPreference(
                pad_token_id=tokenizer.pad_token_id,
                max_length=training_args.max_length,
                truncation_mode=training_args.truncation_mode,
                pad_to_multiple_of=training_args.pad_to_multiple_of,
            )
        super().__init__(*args, data_collator=data_collator, **kwargs)

    # private: DPOTrainer's only hook to skip its own tokenisation [test_private_apis]
    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        """The rows are tokenized and checked already (TRL's preparation would score only the last turn)."""
        missing = set(SCORED_COLUMNS) - set(dataset.column_names)
        if missing:
            raise ValueError(f"the {dataset_name} dataset lacks {sorted(missing)}: build it with prepare_dpo_dataset")
        return dataset

    # private: the Trainer's only hook for the columns `remove_unused_columns` keeps [test_private_apis]
    def _set_signature_columns_if_needed(self):
        """The columns the collator reads (the Trainer drops the others when `remove_unused_columns`)."""
        if self._signature_columns is None:
            self._signature_columns = [*SCORED_COLUMNS, "ref_chosen_logps", "ref_rejected_logps"]


class DPOStage(PostTrainingStage):
    """DPO in the training lifecycle: whole conversations scored turn by turn, `InstellaDPOTrainer`."""

    name = "dpo"
    features = FEATURES
    settings_class = CheckedDPOConfig
    trainer_class = InstellaDPOTrainer
    mixture_kwargs = {"default_converter": "preference"}

    def check(self) -> None:
        self.args.loss_type = [LOSS_ALIASES.get(t, t) for t in self.args.loss_type]
        super().check()

    def prepare(self, mixture, tokenizer):
        args = self.args
        return prepare_dpo_dataset(mixture, tokenizer, args.max_length, args.overlong, args.dataset_num_proc)


def build_trainer(training_args, model_args, callbacks=()):
    """Everything up to a ready trainer (data checked first), for tests and tools: (trainer, data)."""
    return DPOStage(training_args, model_args).build(callbacks)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/dpo.py`: parse the recipe and the command line, then one whole DPO run (exit code 0)."""
    training_args, model_args = parse_recipe([CheckedDPOConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_stage(DPOStage(training_args, model_args, argv))
