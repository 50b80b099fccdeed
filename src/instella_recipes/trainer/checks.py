"""Input checks that every training entry point runs before it starts work."""

import importlib.util
from dataclasses import dataclass

import torch
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


def check_attention(attn_implementation: str | None) -> None:
    """`flash_attention_2` / `_3` needs a GPU and the flash-attn package: say so before any work (transformers says
    it only when the model loads, as a traceback)."""
    if not str(attn_implementation or "").startswith("flash_attention"):
        return
    if not torch.cuda.is_available():
        raise RecipeError(
            f"attn_implementation {attn_implementation} needs a GPU, and this machine has none: use "
            f"--attn_implementation sdpa on CPU"
        )
    if importlib.util.find_spec("flash_attn") is None:
        raise RecipeError(
            f"attn_implementation {attn_implementation} needs the flash-attn package, which is not installed: "
            f"pip install -e '.[gpu]' (or pip install flash-attn), or use --attn_implementation sdpa"
        )


def check_report_to(report_to) -> None:
    """Each logging integration in `report_to` is installed: a missing `wandb` is a transformers traceback when the
    Trainer is built, after the model and data loaded."""
    packages = ("wandb", "mlflow", "comet_ml", "clearml", "trackio")  # integration = its package's import name
    names = [report_to] if isinstance(report_to, str) else list(report_to or [])
    for name in names:
        if name in packages and importlib.util.find_spec(name) is None:
            raise RecipeError(
                f"report_to: {name} is not installed: pip install {name}, or leave it out "
                f"(--report_to tensorboard, or none)"
            )


def check_fits_positions(config, tokens: int, what: str, fix: str) -> None:
    """A run's longest sequence (`tokens`, made as `what` says) must fit the model's `max_position_embeddings`:
    RoPE computes any position, so a longer one trains without a word on positions the model never had. One check
    for SFT's `max_length` and GRPO's prompt + completion caps; `fix` says what to change."""
    limit = getattr(config, "max_position_embeddings", None)
    if limit is not None and tokens > limit:
        name = getattr(config, "_name_or_path", "") or "the model"
        raise RecipeError(
            f"{what} = {tokens} tokens exceed the model's max_position_embeddings {limit} ({name}): {fix}"
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
