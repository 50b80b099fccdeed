"""Range and type checks for numeric recipe fields, called from each argument dataclass's `__post_init__`, and the
checks every parsed recipe passes (`check_numbers`: every number finite, every integer within int64).

A recipe value outside its range (a negative learning rate, zero batches, `max_length -1`, DPO `beta -5`, a NaN
merge weight, `max_steps 1e20`) would otherwise train, skip or silently truncate and still be marked complete. Each
check raises a `RecipeError` that names the field, the allowed range and the value; `parse_recipe` prefixes the
recipe file (or "command line"). What depends on the data (more steps than any run would take over it) is checked
once the data is known, before the model is loaded (`check_training_length`).
"""

import math
import os
from collections.abc import Iterable
from numbers import Integral, Real

from .errors import RecipeError, did_you_mean

INT64_MAX = 2**63 - 1
# More passes over the data than this is a typo (max_steps 1e9 on a few thousand rows), not a recipe: the published
# runs make under 1 (pretraining) to 3 (SFT) passes; tiny CPU runs a few dozen.
MAX_PASSES = 1000


def _describe(low, high, low_open: bool, high_open: bool) -> str:
    if high is None:
        return f"{'>' if low_open else '>='} {low}"
    if low is None:
        return f"{'<' if high_open else '<='} {high}"
    return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_range(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    *,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
    hint: str = "",
) -> None:
    """`value` must be a finite number (an integer with `integer=True`) within `low..high` (inclusive unless
    `low_open`/`high_open`; `None` = unbounded); `None` itself only with `allow_none`. Otherwise a `RecipeError`:
    `<name> must be <range>, got <value>` plus `hint`."""
    if value is None and allow_none:
        return
    kind = "an integer" if integer else "a finite number"  # NaN and inf are numbers too: say which are meant
    wanted = _describe(low, high, low_open, high_open) if (low is not None or high is not None) else kind
    suffix = f" ({hint})" if hint else ""
    numeric = isinstance(value, Integral if integer else Real) and not isinstance(value, bool)
    if not numeric or not math.isfinite(value):
        raise RecipeError(f"{name} must be {kind} {wanted}, got {value!r}{suffix}")
    if integer and abs(value) > INT64_MAX:
        raise RecipeError(f"{name} must be an integer within int64 (|x| <= {INT64_MAX}), got {value!r}{suffix}")
    too_low = low is not None and (value <= low if low_open else value < low)
    too_high = high is not None and (value >= high if high_open else value > high)
    if too_low or too_high:
        raise RecipeError(f"{name} must be {wanted}, got {value!r}{suffix}")


def check_positive(obj, *names: str, integer: bool = True) -> None:
    """Each field `names` of `obj` is >= 1 (integers, the default: batch sizes, steps, workers, token counts) or
    > 0 (`integer=False`)."""
    for name in names:
        if integer:
            check_range(name, getattr(obj, name), 1, integer=True)
        else:
            check_range(name, getattr(obj, name), 0, low_open=True)


def check_numbers(value, name: str) -> None:
    """Every number in `value` (a field's value: a number, or lists and mappings of them, walked through) is finite
    and, if an integer, within int64; otherwise a `RecipeError` naming the field (`weights[0]`,
    `model_config.rms_norm_eps`), what is allowed and the value. Strings and other values are left alone."""
    if isinstance(value, bool):
        return
    if isinstance(value, Integral) and abs(value) > INT64_MAX:
        raise RecipeError(f"{name} must be an integer within int64 (|x| <= {INT64_MAX}), got {value!r}")
    if isinstance(value, Real) and not isinstance(value, Integral) and not math.isfinite(value):
        raise RecipeError(f"{name} must be a finite number, got {value!r}")
    if isinstance(value, dict):
        for key, item in value.items():
            check_numbers(item, f"{name}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            check_numbers(item, f"{name}[{index}]")


# Fields of a transformers model config that count something: each must be >= 1 where it is set.
_MODEL_SIZES = (
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "max_position_embeddings", "num_experts", "num_experts_per_tok",
    "moe_intermediate_size",
)  # fmt: skip


def check_model_config(fields: dict, name: str = "model_config") -> None:
    """The shape of a model a recipe builds from scratch: every number finite, every size >= 1, the attention
    heads dividing hidden_size (unless head_dim is given) and the key/value heads dividing the heads. A
    `RecipeError` names the field, the value and what is allowed, before any weight is allocated."""
    check_numbers(fields, name)
    for key in _MODEL_SIZES:
        if fields.get(key) is not None:
            check_range(f"{name}: {key}", fields[key], 1, integer=True)
    hidden, heads, kv = fields.get("hidden_size"), fields.get("num_attention_heads"), fields.get("num_key_value_heads")
    if hidden and heads and fields.get("head_dim") is None and hidden % heads:
        raise RecipeError(
            f"{name}: hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}); pick heads that "
            f"divide it (or set head_dim)"
        )
    if heads and kv and heads % kv:
        raise RecipeError(
            f"{name}: num_attention_heads ({heads}) is not divisible by num_key_value_heads ({kv}); pick key/value "
            f"heads that divide it"
        )


def check_training_length(max_steps: int, epochs: float, rows: int, rows_per_step: int, what: str) -> None:
    """`max_steps` (or `epochs` when `max_steps` is -1) asks for at most `MAX_PASSES` passes over `rows` rows
    (`rows_per_step` consumed per optimizer step); otherwise a `RecipeError` with the arithmetic and the fix.
    Call it once the data is known, before the model is loaded."""
    if rows <= 0 or rows_per_step <= 0:
        return
    if max_steps is not None and max_steps > 0:
        passes = max_steps * rows_per_step / rows
        if passes > MAX_PASSES:
            raise RecipeError(
                f"max_steps {max_steps} is {passes:.0f} passes over the {rows} {what} ({rows_per_step} per step); at "
                f"most {MAX_PASSES} are allowed: lower max_steps, or set max_steps -1 and num_train_epochs"
            )
    elif epochs > MAX_PASSES:
        raise RecipeError(
            f"num_train_epochs {epochs} is more than {MAX_PASSES} passes over the {rows} {what}: lower it"
        )


def check_choice(name: str, value, choices: Iterable[str]) -> None:
    """`value` is one of `choices`; otherwise a `RecipeError` listing them with the nearest one."""
    choices = list(choices)
    if value not in choices:
        hint = did_you_mean(str(value), choices)
        raise RecipeError(f"{name} must be one of {', '.join(map(str, choices))}, got {value!r} ({hint})")


def _check_optional(args, name: str, *range_args, **range_kwargs) -> None:
    if hasattr(args, name):
        check_range(name, getattr(args, name), *range_args, **range_kwargs)


def check_cpu_processes(args) -> None:
    """Several processes (`torchrun --nproc_per_node N`, srun: WORLD_SIZE > 1) on a machine without a GPU train
    together only with `use_cpu` (transformers then starts the gloo process group; accelerate's CPU launcher says so
    with ACCELERATE_USE_CPU). Without it each process trains alone and the run fails later with an unrelated error
    (a global batch mismatch, a checkpoint folder that does not exist): name the flag instead."""
    world = os.environ.get("WORLD_SIZE", "1")
    if not world.isdigit() or int(world) <= 1 or getattr(args, "use_cpu", True):
        return
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return
    import torch  # only here: the callers' TrainingArguments have imported it already

    if torch.cuda.is_available():
        return
    precision = os.environ.get("ACCELERATE_MIXED_PRECISION")  # set by `accelerate launch` from its config
    if precision is not None and (precision != "no" or int(world) > 2):  # a GPU config (ddp_8gpu, fsdp2_*)
        raise RecipeError(
            f"the accelerate config launched {world} processes with mixed precision {precision}, a GPU config, on a "
            f"machine without a GPU: on CPU run `python scripts/<stage>.py ...` alone, or launch with "
            f"--config_file accelerate_configs/cpu_2proc.yaml and add --use_cpu true",
            every_rank=True,
        )
    raise RecipeError(
        f"{world} processes (WORLD_SIZE={world}: torchrun or srun) on a machine without a GPU: add --use_cpu true "
        f"so that they train together over gloo (without it each process trains alone)",
        every_rank=True,
    )


LIGER_NEEDS = (
    "use_liger_kernel: true needs the liger-kernel package and a CUDA/ROCm GPU (Triton kernels): install "
    "`pip install -c constraints.txt '.[liger]'` on a GPU machine, or set use_liger_kernel: false"
)


def check_liger_kernel(args) -> None:
    """`use_liger_kernel: true` where it cannot run (no liger-kernel or Triton, or no GPU): one line before any work
    instead of transformers' ImportError, or a Triton traceback at the first step (trainer/liger.py applies it)."""
    if not getattr(args, "use_liger_kernel", False):
        return
    import importlib.util

    import torch  # only here: the callers' TrainingArguments have imported it already

    installed = all(importlib.util.find_spec(name) is not None for name in ("liger_kernel", "triton"))
    if not installed or not torch.cuda.is_available() or getattr(args, "use_cpu", False):
        raise RecipeError(LIGER_NEEDS)


def check_training_arguments(args) -> None:
    """The numeric fields our recipes set on transformers' `TrainingArguments` (and TRL's configs, which extend it):
    each one in its range, before the Trainer sees it. Fields a class does not have are skipped. Also several
    processes on CPU without use_cpu (`check_cpu_processes`), and Liger without a GPU (`check_liger_kernel`)."""
    check_cpu_processes(args)
    check_liger_kernel(args)
    check_range("learning_rate", args.learning_rate, 0, hint="0 keeps the weights as they are")
    check_positive(args, "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps")
    check_range("max_steps", args.max_steps, -1, integer=True, hint="-1 trains for num_train_epochs")
    if args.max_steps == 0:
        raise RecipeError("max_steps must be >= 1, or -1 to train for num_train_epochs, got 0 (nothing would train)")
    if args.max_steps < 0:
        check_range("num_train_epochs", args.num_train_epochs, 0, low_open=True, hint="or set max_steps")
    check_range("warmup_steps", args.warmup_steps, 0)
    check_range("weight_decay", args.weight_decay, 0)
    check_range("adam_beta1", args.adam_beta1, 0, 1, high_open=True)
    check_range("adam_beta2", args.adam_beta2, 0, 1, high_open=True)
    check_range("adam_epsilon", args.adam_epsilon, 0, low_open=True)
    check_range("max_grad_norm", args.max_grad_norm, 0, hint="0 turns clipping off")
    check_range("seed", args.seed, 0, integer=True)
    for name in ("logging_steps", "save_steps", "eval_steps"):
        _check_optional(args, name, 0, low_open=True, allow_none=True, hint="a step count, or a fraction < 1")
    _check_optional(args, "save_total_limit", 1, integer=True, allow_none=True)
    _check_optional(args, "max_length", 1, integer=True, allow_none=True, hint="tokens per row; None: no limit")
    _check_optional(args, "max_prompt_length", 1, integer=True, allow_none=True)
    if hasattr(args, "num_generations"):  # GRPO: beta weighs the KL term; 0 turns it off (TRL's default, DAPO)
        _check_optional(args, "beta", 0, hint="the KL coefficient; 0 turns the KL term off")
    else:
        _check_optional(args, "beta", 0, low_open=True, hint="the DPO temperature")
    _check_optional(args, "label_smoothing", 0, 0.5, high_open=True)
