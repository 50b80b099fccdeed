"""Preference tuning (Instella-3B-SFT -> Instella-3B-Instruct) with TRL's DPOTrainer and length-normalised DPO.

    accelerate launch --config_file accelerate_configs/<x>.yaml recipes/dpo.py --config recipes/instella-3b/dpo.yaml
    python recipes/dpo.py --config recipes/tiny/dpo.yaml [--model_name_or_path M --output_dir O ...]

The authors' `dpo_norm` (policy and reference log-probabilities averaged over the response tokens instead of summed,
then the sigmoid DPO loss) is exactly TRL 1.16's `loss_type: sigmoid_norm`: it divides each summed log-ratio by its
completion's token count before `-logsigmoid(beta * (chosen - rejected))`. So no trainer change is needed; the
recipe accepts `dpo_norm` as a name for it. (TRL's logged `rewards/*` stay beta x the *summed* log-ratios.)
`precompute_ref_log_probs: true` computes the reference log-probs once before training (no reference model in
memory during training).
"""

from dataclasses import dataclass

from trl import DPOConfig, DPOTrainer, ModelConfig, get_peft_config

from recipes.post_training.checks import prepare_dpo_dataset
from recipes.post_training.mixture import build_mixture
from recipes.post_training.run import (
    PostTrainArgs,
    cap_rows,
    check_launch,
    load_model,
    load_tokenizer_with_template,
    recipe_path,
    resume_checkpoint,
    save_outputs,
)
from recipes.training.args import exit_on_recipe_error, parse_recipe
from recipes.training.optim import InstellaOptimMixin

LOSS_ALIASES = {"dpo_norm": "sigmoid_norm", "dpo": "sigmoid"}


class InstellaDPOTrainer(InstellaOptimMixin, DPOTrainer):
    """DPOTrainer with Instella's optimizer settings (weight decay applies to all parameters when set)."""


@dataclass
class DPORecipeArgs(PostTrainArgs):
    pass


def build_trainer(args, training_args, model_args):
    """Everything up to a ready trainer (data checked first); returns (trainer, data report dict)."""
    training_args.loss_type = [LOSS_ALIASES.get(t, t) for t in training_args.loss_type]
    tokenizer = load_tokenizer_with_template(args, model_args)
    mixture, sources = build_mixture(
        args.sources, seed=training_args.seed, num_proc=training_args.dataset_num_proc, default_converter="preference"
    )
    mixture = cap_rows(mixture, args)
    train, report = prepare_dpo_dataset(
        mixture, tokenizer, training_args.max_length, args.overlong, training_args.dataset_num_proc
    )
    print(report.summary(), flush=True)
    report.check(args.max_skip_fraction)
    model = load_model(model_args)
    check_launch(args, training_args, model, tokenizer)
    trainer = InstellaDPOTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    return trainer, {"sources": sources, **report.as_dict(), "summary": report.summary()}


@exit_on_recipe_error
def main(argv: list[str] | None = None):
    args, training_args, model_args = parse_recipe([DPORecipeArgs, DPOConfig, ModelConfig], argv)
    trainer, data = build_trainer(args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    out = save_outputs(trainer, model_args, args, recipe_path(argv), "dpo", data)
    print(data["summary"], flush=True)
    print(f"DPO model written to {out}")
    return out


if __name__ == "__main__":
    main()
