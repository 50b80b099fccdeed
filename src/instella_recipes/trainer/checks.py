"""Input checks that every training entry point runs before it starts work."""

from dataclasses import dataclass

from transformers import TrainingArguments

from instella_recipes.core.checks import check_training_arguments
from instella_recipes.core.errors import RecipeError


def check_tokenizer_fits(config, tokenizer) -> None:
    """The model's embedding must have a row for every token id the tokenizer can produce."""
    n_ids = len(tokenizer)
    if config.vocab_size < n_ids:
        raise RecipeError(
            f"config.vocab_size ({config.vocab_size}) is smaller than the tokenizer ({n_ids} ids, "
            f"{getattr(tokenizer, 'name_or_path', '')}): set vocab_size >= {n_ids} in the model config "
            f"(Instella pads 50280 ids to 50304, a multiple of 64)."
        )


def readers(args) -> int:
    """The processes that read different rows: the world size over the sequence-parallel size (the ranks of an SP
    group read the same row; a stage without the SP feature: the world)."""
    return args.world_size // getattr(args, "sequence_parallel_size", 1)


def rows_per_step(args) -> int:
    """The global batch in rows: the distinct rows (sequences, or GRPO's completions) of one optimizer step,
    per_device_train_batch_size x gradient_accumulation_steps x `readers` (what a recipe's `global_batch_size`
    states)."""
    return args.per_device_train_batch_size * args.gradient_accumulation_steps * readers(args)


def check_global_batch(global_batch_size: int, per_device: int, grad_accum: int, world_size: int) -> None:
    """The recipe states the published global batch; the launch must reproduce it exactly."""
    actual = per_device * grad_accum * world_size
    if actual != global_batch_size:
        per_step = per_device * world_size
        fit = global_batch_size // per_step if global_batch_size % per_step == 0 else None
        hint = (
            f"set gradient_accumulation_steps={fit}"
            if fit
            else f"choose per_device_train_batch_size and gradient_accumulation_steps whose product with the world "
            f"size ({world_size}) is {global_batch_size}"
        )
        raise RecipeError(
            f"global batch mismatch: per_device_train_batch_size ({per_device}) x gradient_accumulation_steps "
            f"({grad_accum}) x world size ({world_size}) = {actual}, but the recipe's global_batch_size is "
            f"{global_batch_size}; {hint} (or override --global_batch_size to run a different batch on purpose)."
        )


def fit_accumulation(global_batch_size: int, per_device: int, world_size: int) -> int:
    """The gradient accumulation that makes `per_device x it x world_size` the global batch (`fit_global_batch`: a
    requeued job may come back on another number of nodes); a clear error when no whole number does."""
    per_step = per_device * world_size
    if global_batch_size % per_step:
        raise RecipeError(
            f"fit_global_batch: global_batch_size {global_batch_size} is not a multiple of "
            f"per_device_train_batch_size ({per_device}) x world size ({world_size}); choose a per-device batch that "
            f"divides it on every node count the job may get"
        )
    return global_batch_size // per_step


@dataclass
class CheckedTrainingArguments(TrainingArguments):
    """transformers' `TrainingArguments` whose numeric fields are range-checked first (`core.checks`): a negative
    learning rate or zero epochs is a parse-time error naming the field, not a "complete" random model."""

    def __post_init__(self):
        check_training_arguments(self)
        super().__post_init__()
