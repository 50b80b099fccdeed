"""Instella model class for transformers: importing this package registers it with the Auto classes."""

from .modeling_instella import InstellaConfig, InstellaForCausalLM, InstellaModel, InstellaPreTrainedModel

__all__ = ["InstellaConfig", "InstellaForCausalLM", "InstellaModel", "InstellaPreTrainedModel"]
