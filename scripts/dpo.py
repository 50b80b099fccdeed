"""Preference tuning (Instella-3B-SFT -> Instella-3B-Instruct) with TRL's DPOTrainer and length-normalised DPO.

    accelerate launch --config_file accelerate_configs/<x>.yaml scripts/dpo.py --config recipes/instella-3b/dpo.yaml
    python scripts/dpo.py --config recipes/tiny/dpo.yaml [--model_name_or_path M --output_dir O ...]

The pairs are tokenized as the authors' `dpo_tune.py` (open-instruct) does: each whole conversation at once, every
assistant turn scored, prompt/completion cut where their prefix tokenization puts it
(`instella_recipes/post_training/preference.py`); TRL's trainer gets them pre-tokenized with a per-token score mask,
so its own preparation (which scores only the last turn) is skipped. The authors' `dpo_norm` (policy and reference
log-probabilities averaged over the scored tokens instead of summed, then the sigmoid DPO loss) is exactly TRL 1.16's
`loss_type: sigmoid_norm`: it divides each summed log-ratio by its mask's token count before
`-logsigmoid(beta * (chosen - rejected))`; the recipe accepts `dpo_norm` as a name for it. (TRL's logged `rewards/*`
stay beta x the *summed* log-ratios.)
`precompute_ref_log_probs: true` computes the reference log-probs once before training (no reference model in
memory during training).
"""

from instella_recipes.training.stop_requests import catch_stop_requests

if __name__ == "__main__":
    catch_stop_requests()  # first: the imports below take seconds, and a SIGTERM during them must not be fatal

from instella_recipes.core.command_line import preflight

preflight("dpo", "recipes/tiny/dpo.yaml")  # before torch/TRL load (a wrong recipe fails fast)

from dataclasses import dataclass

from trl import DPOTrainer

from instella_recipes.core import exit_on_recipe_error, parse_recipe, setup_logging
from instella_recipes.post_training.checks import prepare_dpo_dataset
from instella_recipes.post_training.configs import LOSS_ALIASES, CheckedDPOConfig, CheckedModelConfig
from instella_recipes.post_training.preference import SCORED_COLUMNS, DataCollatorForScoredPreference
from instella_recipes.post_training.run import PostTrainArgs, build_trainer_for, run_post_training
from instella_recipes.training.optim import InstellaOptimMixin


class InstellaDPOTrainer(InstellaOptimMixin, DPOTrainer):
    """DPOTrainer with Instella's optimizer settings (weight decay applies to all parameters when set), fed rows from
    `prepare_dpo_dataset` (whole conversations + score masks) through `DataCollatorForScoredPreference`."""

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


@dataclass
class DPORecipeArgs(PostTrainArgs):
    pass


def build_trainer(args, training_args, model_args, preemption=None):
    """Everything up to a ready trainer (data checked first); returns (trainer, data report dict)."""
    training_args.loss_type = [LOSS_ALIASES.get(t, t) for t in training_args.loss_type]
    return build_trainer_for(
        InstellaDPOTrainer, prepare_dpo_dataset, args, training_args, model_args, preemption,
        default_converter="preference",
    )  # fmt: skip


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    args, training_args, model_args = parse_recipe([DPORecipeArgs, CheckedDPOConfig, CheckedModelConfig], argv)
    setup_logging()
    return run_post_training(build_trainer, args, training_args, model_args, argv, "dpo")


if __name__ == "__main__":
    raise SystemExit(main())
