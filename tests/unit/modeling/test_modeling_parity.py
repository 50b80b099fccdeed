"""Parity with the authors' published Hub model code (fixture made with it on random weights, fp32, eager).

The weights are loaded through `from_pretrained` from a folder holding the fixture's tensors under their Hub key
names, so a passing test also proves the key names; loading is strict, so a renamed key would fail here.
"""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from modeling_instella import InstellaConfig, InstellaForCausalLM

TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def reference(reference_fixture, tmp_path_factory):
    with safe_open(str(reference_fixture), "pt") as handle:
        config = json.loads(handle.metadata()["dev"])
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    folder = tmp_path_factory.mktemp("reference_model")
    weights = {k.removeprefix("dev/weights/"): v for k, v in tensors.items() if k.startswith("dev/weights/")}
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    InstellaConfig(**config).save_pretrained(folder)
    return folder, {k.removeprefix("dev/"): v for k, v in tensors.items() if not k.startswith("dev/weights/")}


def load(folder, attn):
    return InstellaForCausalLM.from_pretrained(folder, attn_implementation=attn, dtype=torch.float32).eval()


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_logits_match_reference(reference, attn):
    folder, ref = reference
    model = load(folder, attn)
    with torch.no_grad():
        unpadded = model(ref["input_ids"][:1]).logits
        padded = model(ref["input_ids"], attention_mask=ref["attention_mask"]).logits
    assert (unpadded - ref["logits_unpadded"]).abs().max() < TOLERANCE
    valid = ref["attention_mask"].bool()  # padded positions attend to nothing: their logits are undefined
    assert (padded - ref["logits_padded"])[valid].abs().max() < TOLERANCE


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_greedy_tokens_match_reference(reference, attn):
    folder, ref = reference
    model = load(folder, attn)
    out = model.generate(
        ref["input_ids"],
        attention_mask=ref["attention_mask"],
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=1,
        eos_token_id=None,
    )
    assert torch.equal(out, ref["greedy"])
