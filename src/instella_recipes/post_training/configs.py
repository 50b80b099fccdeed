"""TRL's configs with their numeric fields range-checked at parse time (`core.checks`), and the DPO loss names.

Without these checks SFT `max_length -1` silently drops every row's closing EOS label, DPO `beta -5` trains towards
the rejected answers, and an unknown `loss_type` fails only after the model and data are loaded.
"""

import re
from dataclasses import dataclass

from trl import DPOConfig, ModelConfig, SFTConfig

from instella_recipes.core.checks import check_choice, check_range, check_training_arguments

# Our recipe names for TRL's losses (SPEC: Instella's DPO is `dpo_norm`).
LOSS_ALIASES = {"dpo_norm": "sigmoid_norm", "dpo": "sigmoid"}


def dpo_loss_types() -> list[str] | None:
    """The loss names TRL's DPOConfig documents, plus our aliases. TRL keeps no list of them in code (its trainer
    branches on the names), so they are read from the field's help text; None if that text names none (a TRL
    version that words it differently), and the check is then left to TRL."""
    help_text = DPOConfig.__dataclass_fields__["loss_type"].metadata.get("help", "")
    names = set(re.findall(r"`'(\w+)'`", help_text))
    return sorted(names | set(LOSS_ALIASES)) if names else None


@dataclass
class CheckedSFTConfig(SFTConfig):
    def __post_init__(self):
        check_training_arguments(self)
        super().__post_init__()


@dataclass
class CheckedDPOConfig(DPOConfig):
    def __post_init__(self):
        check_training_arguments(self)
        known = dpo_loss_types()
        for name in ([self.loss_type] if isinstance(self.loss_type, str) else self.loss_type) if known else []:
            check_choice("loss_type", name, known)
        super().__post_init__()


@dataclass
class CheckedModelConfig(ModelConfig):
    """TRL's ModelConfig with the LoRA numbers checked."""

    def __post_init__(self):
        check_range("lora_r", self.lora_r, 1, integer=True)
        check_range("lora_alpha", self.lora_alpha, 0, low_open=True)
        check_range("lora_dropout", self.lora_dropout, 0, 1, high_open=True)
        super().__post_init__()
