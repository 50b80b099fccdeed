# Copyright 2026 The Instella recipes authors. Licensed under the Apache License, Version 2.0.
r"""Instella: a Llama-style pre-norm decoder with OLMo-2's full-width QK-norm.

This one file holds the config and the model, like the published Hub repos (amd/Instella-3B*), whose `auto_map`
names `modeling_instella.InstellaConfig` and `modeling_instella.InstellaForCausalLM`. `save_pretrained` copies it
next to the weights, so it must import nothing from this project: only `transformers` and `torch`.

Everything that Instella shares with transformers' Llama and OLMo-2 is imported from there; each class below says
in one line how it differs. The transformers conventions follow Llama's classes: `base_model_prefix = "model"`,
`_no_split_modules`, gradient checkpointing, the attention back-ends (`_supports_*`), `_can_record_outputs`, and the
parallel plans: the causal LM's `_tp_plan` / `_pp_plan` / `_fsdp_plan` come from `LlamaForCausalLM`, the base model's
`base_model_tp_plan` / `base_model_pp_plan` from `Olmo2Config` (q/k/v gather their output because the full-width
QK-norm needs all heads, exactly as in OLMo-2). `AutoConfig`, `AutoModel` and `AutoModelForCausalLM` resolve
"instella", and every saved `config.json` names all three in `auto_map` (a superset of the published map).

Loading rule (`from_pretrained`). transformers only warns when a checkpoint's keys do not match the class and
initialises the missing tensors at random, which silently yields a broken model. Here:

- a checkpoint read from a folder or the Hub whose keys or shapes do not match the class is an error (missing,
  unexpected or mis-shaped tensors; `ignore_mismatched_sizes=True` opts out), naming the keys and the converter;
- except for the head, where transformers' contract holds: a base-model checkpoint (`config.json` architectures
  `["InstellaModel"]`) loads into `InstellaForCausalLM` with a freshly initialised `lm_head` (transformers warns),
  and a causal-LM checkpoint loads into `InstellaModel` with its `lm_head` dropped;
- with no checkpoint (`from_pretrained(None, config=..., state_dict=...)`, how tools build a model from tensors they
  hold) transformers' contract holds unchanged: missing tensors are initialised, with its warning.

Relaxing it narrowly, with transformers' own mechanisms (the check reads the loading report after transformers has
applied them), rather than `ignore_mismatched_sizes=True`, which turns the whole check off:
- keys that may be absent or extra: a subclass with `_keys_to_ignore_on_load_missing` /
  `_keys_to_ignore_on_load_unexpected` (regexes searched in each key), e.g. for a checkpoint without QK-norm weights
  `class NoQKNorm(InstellaForCausalLM): _keys_to_ignore_on_load_missing = [r"self_attn\.[qk]_norm\.weight$"]`
  (those tensors are then initialised: ones for a norm); every other key is still checked;
- keys stored under other names: `from_pretrained(path, key_mapping={r"^old\.prefix\.": "model."})` renames them
  as they load (regex -> replacement), and the renamed keys are checked like any other.

Packed documents (several documents in one row) never see each other. They are given as flash-attention varlen
boundaries (`cu_seq_lens_q/k`) or as position_ids restarting per document with no 2D mask (transformers' rule; here
also in an evaluation prefill with an empty KV cache, where transformers skips it). `InstellaModel` builds the
causal same-document mask with transformers' own mask builders for eager / sdpa (dense) and flex_attention (a
block-sparse `BlockMask`: only the documents' diagonal blocks are computed); the flash kernels read the boundaries
themselves; any other implementation refuses packed input in one line unless its attention function declares
`handles_documents = True`. `attn_implementation="flash_or_flex"` takes flash_attention_2 where flash-attn is
installed and flex_attention otherwise: the setting for long-context and packed runs.
"""

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM
from transformers.cache_utils import Cache
from transformers.generation import GenerationMixin
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    and_masks,
    causal_mask_function,
    find_packed_sequence_indices,
    packed_sequence_mask_function,
    padding_mask_function,
)
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.models.llama.modeling_llama import (
    LlamaForCausalLM,
    LlamaModel,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)
from transformers.models.olmo2.configuration_olmo2 import Olmo2Config
from transformers.models.olmo2.modeling_olmo2 import Olmo2Attention, Olmo2MLP
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, is_flash_attn_2_available

FLASH_ATTENTION_HINT = (
    "attn_implementation='flash_attention_2' needs the flash-attn package, which is not installed. "
    "Install the GPU extra (`pip install -e '.[gpu]'` in this repo, or `pip install flash-attn`), "
    "or use attn_implementation='sdpa' (the default) or 'eager'."
)
# What every saved config.json names (remote code): the published map plus the base model.
AUTO_MAP = {
    "AutoConfig": "modeling_instella.InstellaConfig",
    "AutoModel": "modeling_instella.InstellaModel",
    "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
}
HEAD_PREFIX = "lm_head."
# `attn_implementation=FLASH_OR_FLEX`: flash_attention_2 where flash-attn is installed, flex_attention otherwise. Both
# honour packed documents without a dense mask (varlen kernels; a block-sparse BlockMask), so long-context and packed
# recipes name this one setting instead of falling back to sdpa's dense (T x T) document mask.
FLASH_OR_FLEX = "flash_or_flex"
# An attention function registered with transformers' `AttentionInterface` that builds its own per-document mask
# (e.g. a sequence-parallel wrapper) sets this attribute to True; any other implementation outside transformers'
# mask registry (sdpa, eager, flex_attention) and the flash kernels refuses packed documents.
HANDLES_DOCUMENTS = "handles_documents"


@strict
class InstellaConfig(Olmo2Config):
    """OLMo-2's config with Instella-3B's published values as defaults and its token ids (bos = eos = 0, pad = 1).

    The published `config.json` (with `rope_theta` and `rope_scaling: null`) loads unchanged; saving writes both the
    transformers-5 `rope_parameters` and the legacy `rope_theta` / `rope_scaling` so transformers 4.x readers of the
    published remote code still find them.
    """

    model_type = "instella"

    vocab_size: int = 50304
    hidden_size: int = 2560
    intermediate_size: int = 6912
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int | None = None
    max_position_embeddings: int = 4096
    pad_token_id: int | None = 1
    bos_token_id: int | None = 0
    eos_token_id: int | list[int] | None = 0

    def validate_architecture(self):
        """Part of `@strict` validation: attention shapes must split evenly (checked before any weight is made)."""
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"InstellaConfig: hidden_size ({self.hidden_size}) is not divisible by num_attention_heads "
                f"({self.num_attention_heads}); choose num_attention_heads that divides hidden_size "
                f"(head_dim = hidden_size / num_attention_heads)."
            )
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ValueError(
                f"InstellaConfig: num_attention_heads ({self.num_attention_heads}) is not divisible by "
                f"num_key_value_heads ({self.num_key_value_heads}); set num_key_value_heads to a divisor of "
                f"num_attention_heads (equal to it for plain multi-head attention, as published)."
            )

    def save_pretrained(self, save_directory, push_to_hub=False, **kwargs):
        """`PreTrainedConfig.save_pretrained`, with `auto_map` naming the config, the base model and the causal LM
        (transformers writes only the class being saved), so AutoModel and AutoModelForCausalLM both load the
        folder as remote code."""
        self.auto_map = {**(getattr(self, "auto_map", None) or {}), **AUTO_MAP}
        return super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    def to_dict(self):
        output = super().to_dict()
        rope = output.get("rope_parameters") or {}
        if rope.get("rope_type", "default") == "default" and "rope_theta" in rope:
            output["rope_theta"] = rope["rope_theta"]
            output["rope_scaling"] = None
        return output


class InstellaRMSNorm(LlamaRMSNorm):
    """Llama's RMSNorm (normalise in fp32, cast back, then scale); OLMo-2's scales before the cast."""


class InstellaAttention(Olmo2Attention):
    """OLMo-2 attention (full-width q/k RMSNorm before RoPE) with Llama's RMSNorm numerics for q_norm / k_norm."""

    def __init__(self, config: InstellaConfig, layer_idx: int | None = None):
        super().__init__(config, layer_idx)
        self.q_norm = InstellaRMSNorm(config.num_attention_heads * self.head_dim, config.rms_norm_eps)
        self.k_norm = InstellaRMSNorm(config.num_key_value_heads * self.head_dim, config.rms_norm_eps)


class InstellaMLP(Olmo2MLP):
    """OLMo-2's (= Llama's) SwiGLU MLP, `down(silu(gate(x)) * up(x))`, never with biases."""


class InstellaDecoderLayer(GradientCheckpointingLayer):
    """Llama's pre-norm block, with the norms named as in the published checkpoints (`pre_*_layernorm`)."""

    def __init__(self, config: InstellaConfig, layer_idx: int):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = InstellaAttention(config=config, layer_idx=layer_idx)
        self.mlp = InstellaMLP(config)
        self.pre_attention_layernorm = InstellaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.pre_feedforward_layernorm = InstellaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool | None = False,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> torch.Tensor:
        attn_out, _ = self.self_attn(
            hidden_states=self.pre_attention_layernorm(hidden_states),
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            use_cache=use_cache,
            position_embeddings=position_embeddings,
            **kwargs,
        )
        hidden_states = hidden_states + attn_out
        return hidden_states + self.mlp(self.pre_feedforward_layernorm(hidden_states))


class InstellaPreTrainedModel(PreTrainedModel):
    """Llama's pretrained-model settings for Instella modules, plus strict loading and a clear flash-attn error."""

    config_class = InstellaConfig
    config: InstellaConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["InstellaDecoderLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_flash_attn = True
    _supports_sdpa = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    _supports_attention_backend = True
    _can_record_outputs = {"hidden_states": InstellaDecoderLayer, "attentions": InstellaAttention}

    # private: the one check every attention choice passes (init and set_attn_implementation) [test_private_apis]
    def _check_and_adjust_attn_implementation(self, attn_implementation, is_init_check=False, **kwargs):
        if attn_implementation == FLASH_OR_FLEX:
            attn_implementation = "flash_attention_2" if is_flash_attn_2_available() else "flex_attention"
        if attn_implementation == "flash_attention_2" and not is_flash_attn_2_available():
            raise ImportError(FLASH_ATTENTION_HINT)
        return super()._check_and_adjust_attn_implementation(attn_implementation, is_init_check, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path=None, *args, **kwargs):
        """`PreTrainedModel.from_pretrained` under the loading rule of the module docstring: a checkpoint read from
        a folder or the Hub whose keys or shapes do not match is an error; the head follows transformers' contract
        (a base-model checkpoint gets a fresh `lm_head`, a causal-LM checkpoint loads into the base model), and so
        does building with no checkpoint (`pretrained_model_name_or_path=None`)."""
        wants_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True, **kwargs)
        if pretrained_model_name_or_path is not None and not kwargs.get("ignore_mismatched_sizes"):
            problems = cls._checkpoint_problems(model, info)
            if problems:
                raise ValueError(cls._mismatch_message(pretrained_model_name_or_path, problems))
        return (model, info) if wants_info else model

    @classmethod
    def _mismatch_message(cls, source, problems: dict[str, list[str]]) -> str:
        details = "; ".join(f"{k}: {v[:5]}{' ...' if len(v) > 5 else ''} ({len(v)})" for k, v in problems.items())
        return (
            f"{cls.__name__}.from_pretrained({source!s}): the checkpoint does not match the config ({details}). "
            f"Hub-format keys are expected (model.layers.N.self_attn.q_proj.weight, ...); convert an OLMo training "
            f"checkpoint (transformer.blocks.N.att_proj.weight, ...) with `python scripts/convert_checkpoint.py "
            f"to-hub`, and check that config.json matches the weights. To accept known differences narrowly: "
            f"`key_mapping=` for renamed keys, `_keys_to_ignore_on_load_missing/unexpected` regexes on a subclass "
            f"(modeling_instella.py's docstring)."
        )

    @staticmethod
    def _checkpoint_problems(model, info) -> dict[str, list[str]]:
        """The loading report's missing / unexpected / mis-shaped keys, less the head keys that transformers'
        contract lets differ: `lm_head.*` unexpected in a base model, or missing from a base-model checkpoint."""
        problems = {k: sorted(info.get(k) or []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        problems["mismatched_keys"] = [k[0] if isinstance(k, tuple) else k for k in problems["mismatched_keys"]]
        if not hasattr(model, "lm_head"):
            problems["unexpected_keys"] = [k for k in problems["unexpected_keys"] if not k.startswith(HEAD_PREFIX)]
        elif (getattr(model.config, "architectures", None) or []) == [InstellaModel.__name__]:
            problems["missing_keys"] = [k for k in problems["missing_keys"] if not k.startswith(HEAD_PREFIX)]
        return {k: v for k, v in problems.items() if v}


class InstellaModel(InstellaPreTrainedModel, LlamaModel):
    """Llama's decoder stack and forward (masks, cache, RoPE) over Instella decoder layers."""

    def __init__(self, config: InstellaConfig):
        InstellaPreTrainedModel.__init__(self, config)
        self.padding_idx = config.pad_token_id
        self.vocab_size = config.vocab_size
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, self.padding_idx)
        self.layers = nn.ModuleList([InstellaDecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = InstellaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPast:
        # A training forward never needs a KV cache, and an (empty) cache makes transformers skip its packed-sequence
        # detection: padding-free batches (position_ids restarting per document, no attention_mask) would then
        # attend across documents. Llama defaults to config.use_cache=True even in training; we do not.
        if use_cache is None and self.training:
            use_cache = False
        documents = self._documents(kwargs.get("cu_seq_lens_q"), position_ids, attention_mask, past_key_values,
                                    input_ids if input_ids is not None else inputs_embeds[..., 0])  # fmt: skip
        if documents is not None:
            dtype = inputs_embeds.dtype if inputs_embeds is not None else self.embed_tokens.weight.dtype
            varlen = kwargs.get("cu_seq_lens_q") is not None
            attention_mask = self._document_mask(documents, varlen, attention_mask, past_key_values, dtype)
        return super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )

    @staticmethod
    def _documents(cu_seq_lens, position_ids, attention_mask, past_key_values, reference) -> torch.Tensor | None:
        """The document index of every token `(batch, length)` of a packed batch, else None. Documents are given
        as flash-attention varlen boundaries (`cu_seq_lens_q`, as `DataCollatorWithFlattening(
        return_flash_attn_kwargs=True)` and the authors' `cu_doc_lens` give them; positions need not restart: RoPE
        scores depend on relative positions only), or as position_ids restarting per document with no 2D mask:
        transformers' own rule (`find_packed_sequence_indices`), which transformers applies only without a KV cache;
        here also with an empty one (an evaluation prefill), so documents never see each other there either."""
        batch, length = reference.shape[:2]
        if cu_seq_lens is not None:
            bounds = cu_seq_lens.to(reference.device)
            document = torch.bucketize(torch.arange(length, device=reference.device), bounds[1:], right=True)
            return document[None].expand(batch, length)
        if position_ids is None or attention_mask is not None or length == 1:
            return None
        if past_key_values is not None and (torch.compiler.is_compiling() or past_key_values.get_seq_length() > 0):
            return None  # a decoding step continues the cache's last document (traced: transformers' rule)
        return find_packed_sequence_indices(position_ids.expand(batch, -1))

    def _document_mask(self, documents: torch.Tensor, varlen: bool, attention_mask, past_key_values, dtype):
        """The mask that keeps each packed document to itself, for this model's attention implementation:
        transformers' own mask builders (`ALL_MASK_ATTENTION_FUNCTIONS`) with transformers' packed-sequence mask
        function, causal and same-document: a block-sparse `BlockMask` for flex_attention (only the blocks on the
        diagonal documents are computed), a dense 4D mask for sdpa (bool) and eager (additive), which transformers
        passes through as they are. The flash kernels take the documents themselves (varlen `cu_seq_lens`, or
        position_ids restarts in a batch of one row), so their mask is left as it is. Any other implementation
        refuses packed documents (ValueError) unless its function declares `handles_documents`: none may attend
        across documents silently."""
        # private: the config's attention name, as transformers' models read it [test_private_apis]
        implementation = self.config._attn_implementation
        batch, length = documents.shape
        if implementation in ALL_MASK_ATTENTION_FUNCTIONS and not implementation.startswith("flash"):
            sizes = (length, 0) if past_key_values is None else past_key_values.get_mask_sizes(length, 0)
            kv_length, kv_offset = sizes
            padded = torch.nn.functional.pad(documents, (0, kv_length - length), value=-1)  # a static cache's tail
            same_document = and_masks(causal_mask_function, packed_sequence_mask_function(padded))
            if implementation == "flex_attention" and torch.compiler.is_compiling():
                # transformers' flex_attention_mask asks `create_block_mask(_compile=True)`, which torch 2.13
                # deprecates with a warning: a graph break inside a compiled forward. There the plain call is
                # traced into the graph (compiled with it), so the mask is the same and the graph stays whole.
                if attention_mask is not None:
                    same_document = and_masks(same_document, padding_mask_function(attention_mask.bool()))
                return create_block_mask(same_document, batch, None, length, kv_length, device=documents.device)
            return ALL_MASK_ATTENTION_FUNCTIONS[implementation](
                batch_size=batch, q_length=length, kv_length=kv_length, q_offset=0, kv_offset=kv_offset,
                mask_function=same_document, attention_mask=attention_mask, allow_is_causal_skip=False, dtype=dtype,
                config=self.config, use_vmap=False, device=documents.device,
            )  # fmt: skip
        if implementation == "vllm":
            # vLLM's transformers backend runs the model on its flattened batch (position_ids restarting per request,
            # no 2D mask) with its own attention, which keeps the requests apart through vLLM's own metadata
            return attention_mask
        flash = implementation.startswith("flash") or "flash" in implementation.split("/")[-1]
        if flash and (varlen or batch == 1):
            return attention_mask
        if getattr(ALL_ATTENTION_FUNCTIONS.get(implementation), HANDLES_DOCUMENTS, False):
            return attention_mask
        raise ValueError(
            f"attn_implementation={implementation!r} cannot keep packed documents apart "
            f"({'a batch of more than one row' if flash else 'no document mask'}): use flex_attention, sdpa, "
            f"eager or {FLASH_OR_FLEX!r}, or give flash attention one packed row with cu_seq_lens_q/k"
        )


class InstellaForCausalLM(InstellaPreTrainedModel, LlamaForCausalLM, GenerationMixin):
    """Llama's causal-LM head and forward over `InstellaModel`; the lm_head is never tied (published: untied)."""

    _tied_weights_keys = {}

    def __init__(self, config: InstellaConfig):
        InstellaPreTrainedModel.__init__(self, config)
        self.model = InstellaModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()


# Registration: `AutoConfig` / `AutoModel` / `AutoModelForCausalLM` resolve "instella" on import, and
# `save_pretrained` writes the `auto_map` and copies this file, so the folder loads elsewhere with trust_remote_code.
AutoConfig.register("instella", InstellaConfig, exist_ok=True)
AutoModel.register(InstellaConfig, InstellaModel, exist_ok=True)
AutoModelForCausalLM.register(InstellaConfig, InstellaForCausalLM, exist_ok=True)
InstellaConfig.register_for_auto_class()
InstellaModel.register_for_auto_class("AutoModel")
InstellaForCausalLM.register_for_auto_class("AutoModelForCausalLM")

__all__ = ["InstellaConfig", "InstellaForCausalLM", "InstellaModel", "InstellaPreTrainedModel"]
