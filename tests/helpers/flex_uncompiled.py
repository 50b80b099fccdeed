"""Run transformers' flex_attention path uncompiled in a CPU test: transformers compiles flex_attention and its block
mask (inductor: about a minute on CPU, the GPU's job); torch's reference implementation computes the same masks."""

from torch.nn.attention import flex_attention as torch_flex
from transformers.integrations import flex_attention as hf_flex


def use_uncompiled_flex(monkeypatch) -> None:
    """Swap transformers' compiled flex_attention and `create_block_mask(_compile=True)` for the uncompiled ones."""

    def flex(query, key, value, training=False, **kwargs):
        return torch_flex.flex_attention(query, key, value, **kwargs)

    def block_mask(*args, _compile=False, **kwargs):
        return torch_flex.create_block_mask(*args, _compile=False, **kwargs)

    monkeypatch.setattr(hf_flex, "compile_friendly_flex_attention", flex)
    monkeypatch.setattr("transformers.masking_utils.create_block_mask", block_mask)
