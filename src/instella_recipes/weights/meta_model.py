"""The model a config describes, built on the meta device: every parameter's name, shape and dtype, no memory and
no initialisation cost (parameter counts, checkpoint-vs-config checks, loading a state dict with `assign=True`)."""

import torch


def build_meta_model(config):
    """The model for `config` with parameters on the meta device: shapes only, no memory, no init cost."""
    from transformers import AutoModelForCausalLM  # transformers' Auto classes: imported on first use (slow)

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
