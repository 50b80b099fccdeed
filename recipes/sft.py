"""Supervised fine-tuning (Instella-3B -> Instella-3B-SFT) with TRL's SFTTrainer.

    accelerate launch --config_file accelerate_configs/<x>.yaml recipes/sft.py --config recipes/instella-3b/sft.yaml
    python recipes/sft.py --config recipes/tiny/sft.yaml [--model_name_or_path M --output_dir O ...]

The data mixture is converted to `messages`, checked and tokenized here with the Instella chat template and
assistant-only labels (assistant content + its EOS), then handed to SFTTrainer pre-tokenized; TRL pads (one example
per row, `pad_to_multiple_of: max_length` as published) or packs padding-free (`packing: true`). The OLMo schedule
and all-parameter weight decay come from `InstellaOptimMixin`. The output folder gets the model, the tokenizer with
the chat template, trainer_state.json, data_report.json and manifest.json (last).
"""

from dataclasses import dataclass

from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from recipes.post_training.checks import prepare_sft_dataset
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
from recipes.training.args import RecipeError, exit_on_recipe_error, parse_recipe
from recipes.training.optim import InstellaOptimMixin


class InstellaSFTTrainer(InstellaOptimMixin, SFTTrainer):
    """SFTTrainer with Instella's optimizer settings and LR schedule."""


@dataclass
class SFTRecipeArgs(PostTrainArgs):
    pass


def build_trainer(args, training_args, model_args):
    """Everything up to a ready trainer (data checked first); returns (trainer, data report dict)."""
    if training_args.assistant_only_loss or training_args.completion_only_loss:
        raise RecipeError(
            "remove assistant_only_loss / completion_only_loss: this recipe already builds assistant-only labels "
            "from the Instella chat template (see recipes/post_training/template.py)"
        )
    tokenizer = load_tokenizer_with_template(args, model_args)
    mixture, sources = build_mixture(args.sources, seed=training_args.seed, num_proc=training_args.dataset_num_proc)
    mixture = cap_rows(mixture, args)
    train, report = prepare_sft_dataset(
        mixture, tokenizer, training_args.max_length, args.overlong, training_args.dataset_num_proc
    )
    print(report.summary(), flush=True)
    report.check(args.max_skip_fraction)
    model = load_model(model_args)
    check_launch(args, training_args, model, tokenizer)
    trainer = InstellaSFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    return trainer, {"sources": sources, **report.as_dict(), "summary": report.summary()}


@exit_on_recipe_error
def main(argv: list[str] | None = None):
    args, training_args, model_args = parse_recipe([SFTRecipeArgs, SFTConfig, ModelConfig], argv)
    trainer, data = build_trainer(args, training_args, model_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    out = save_outputs(trainer, model_args, args, recipe_path(argv), "sft", data)
    print(data["summary"], flush=True)
    print(f"SFT model written to {out}")
    return out


if __name__ == "__main__":
    main()
