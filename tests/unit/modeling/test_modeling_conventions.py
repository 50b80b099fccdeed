"""transformers' conventions for a new model, each checked against Llama's / OLMo-2's classes or by running it:
Auto classes and auto_map, forward signatures, attentions / hidden states, the loading rule (strict for checkpoints,
transformers' contract for heads and for no checkpoint), parallel plans (tensor parallel run on 2 gloo processes),
attention back-ends."""

import inspect
import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import (
    AttentionInterface,
    AutoModel,
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    LlamaModel,
    Olmo2Config,
    Olmo2ForCausalLM,
    pipeline,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaPreTrainedModel
from transformers.models.olmo2.modeling_olmo2 import Olmo2PreTrainedModel

from modeling_instella import InstellaForCausalLM, InstellaModel, InstellaPreTrainedModel
from modeling_instella.modeling_instella import InstellaAttention, InstellaDecoderLayer
from tests.conftest import tiny_config

PUBLISHED_AUTO_MAP = {  # SPEC.md 1: the published config.json's auto_map
    "AutoConfig": "modeling_instella.InstellaConfig",
    "AutoModelForCausalLM": "modeling_instella.InstellaForCausalLM",
}


def seeded(cls, seed=0, **overrides):
    torch.manual_seed(seed)
    return cls(tiny_config(**overrides)).eval()


# 1. Auto classes ------------------------------------------------------------------------------------------------


def test_auto_model_builds_the_base_model_and_round_trips(tmp_path):
    base = AutoModel.from_config(tiny_config())
    assert type(base) is InstellaModel
    base.save_pretrained(tmp_path / "base")
    saved = json.loads((tmp_path / "base" / "config.json").read_text())
    assert saved["architectures"] == ["InstellaModel"]
    assert saved["auto_map"] == {**PUBLISHED_AUTO_MAP, "AutoModel": "modeling_instella.InstellaModel"}
    loaded = AutoModel.from_pretrained(tmp_path / "base").eval()
    ids = torch.randint(2, 512, (1, 7))
    with torch.no_grad():
        assert torch.equal(loaded(ids).last_hidden_state, base.eval()(ids).last_hidden_state)
    torch.save(base.state_dict(), tmp_path / "state.pt")  # plain torch round trip of the base model
    fresh = InstellaModel(tiny_config())
    fresh.load_state_dict(torch.load(tmp_path / "state.pt"))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), base.state_dict().values()))


def test_causal_lm_folder_names_the_base_model_too(tmp_path):
    seeded(InstellaForCausalLM).save_pretrained(tmp_path)
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {**PUBLISHED_AUTO_MAP, "AutoModel": "modeling_instella.InstellaModel"}
    assert type(AutoModel.from_pretrained(tmp_path)) is InstellaModel  # the causal LM's body, head dropped


def test_feature_extraction_pipeline_returns_the_base_model_states(tmp_path, tiny_tokenizer):
    base = seeded(InstellaModel, vocab_size=len(tiny_tokenizer))
    base.save_pretrained(tmp_path)
    tiny_tokenizer.save_pretrained(tmp_path)
    features = pipeline("feature-extraction", model=str(tmp_path), framework="pt", device="cpu")("the cat sat")
    ids = tiny_tokenizer("the cat sat", return_tensors="pt").input_ids
    with torch.no_grad():
        expected = base(ids).last_hidden_state
    assert torch.allclose(torch.tensor(features), expected, atol=1e-5)


# 2. Signatures and outputs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ours, llama",
    [(InstellaModel, LlamaModel), (InstellaForCausalLM, LlamaForCausalLM), (InstellaDecoderLayer, LlamaDecoderLayer)],
)
def test_forward_signatures_are_llamas(ours, llama):
    """Same parameter names, order, defaults and annotations (`**kwargs: Unpack[TransformersKwargs]` included), so
    signature-inspecting tools (generate's kwarg validation, output capture) treat both alike."""
    mine, theirs = inspect.signature(ours.forward), inspect.signature(llama.forward)
    assert list(mine.parameters) == list(theirs.parameters)
    for name, parameter in theirs.parameters.items():
        assert mine.parameters[name].annotation == parameter.annotation, name
        if name != "use_cache":  # the decoder layer takes use_cache=False, as Llama's
            assert mine.parameters[name].default == parameter.default, name
    assert mine.return_annotation == theirs.return_annotation


@pytest.mark.parametrize("cls", [InstellaModel, InstellaForCausalLM])
def test_output_attentions_and_hidden_states(cls):
    model = seeded(cls)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        out = model(torch.randint(2, 512, (2, 6)), output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == 2 and len(out.hidden_states) == 3  # per layer; embeddings + per layer
    for attention in out.attentions:
        assert attention.shape == (2, 4, 6, 6)
        assert torch.allclose(attention.sum(-1), torch.ones(2, 4, 6), atol=1e-5)  # softmax rows
        assert torch.all(attention.triu(diagonal=1) == 0)  # causal


def test_generate_returns_attentions():
    model = seeded(InstellaForCausalLM)
    model.set_attn_implementation("eager")
    out = model.generate(torch.randint(2, 512, (1, 5)), max_new_tokens=3, do_sample=False, output_attentions=True,
                         return_dict_in_generate=True, pad_token_id=1, eos_token_id=None)  # fmt: skip
    assert len(out.attentions) == 3 and all(len(step) == 2 for step in out.attentions)


# 3. The loading rule ----------------------------------------------------------------------------------------------


def test_no_checkpoint_follows_transformers_contract():
    config = tiny_config()
    built = InstellaForCausalLM.from_pretrained(None, config=config, state_dict={})
    assert isinstance(built, InstellaForCausalLM) and built.lm_head.weight.std() > 0  # initialised, not empty
    reference = seeded(InstellaForCausalLM)
    model = InstellaForCausalLM.from_pretrained(None, config=config, state_dict=reference.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))


def test_base_checkpoint_loads_into_causal_lm_with_a_fresh_head(tmp_path):
    base = seeded(InstellaModel)
    base.save_pretrained(tmp_path)
    model, info = InstellaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == ["lm_head.weight"]  # transformers reports it; we let it through
    assert all(torch.equal(model.model.state_dict()[k], v) for k, v in base.state_dict().items())
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path)) is InstellaForCausalLM


def test_causal_checkpoint_loads_into_base_model_without_its_head(tmp_path):
    causal = seeded(InstellaForCausalLM)
    causal.save_pretrained(tmp_path)
    base = InstellaModel.from_pretrained(tmp_path)
    assert all(torch.equal(base.state_dict()[k], v) for k, v in causal.model.state_dict().items())


def _edit_checkpoint(folder, edit):
    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize(
    "cls, saved, edit, message",
    [
        # a causal-LM checkpoint that lost its head is a broken conversion, not a base model
        (InstellaForCausalLM, InstellaForCausalLM, lambda t: t.pop("lm_head.weight"), "missing_keys: ['lm_head"),
        (InstellaForCausalLM, InstellaForCausalLM, lambda t: t.pop("model.layers.1.self_attn.q_norm.weight"),
         "missing_keys: ['model.layers.1.self_attn.q_norm"),
        (InstellaForCausalLM, InstellaForCausalLM, lambda t: t.update({"model.extra.weight": torch.zeros(2)}),
         "unexpected_keys: ['model.extra.weight']"),
        # a base-model checkpoint may lack the head, nothing else
        (InstellaForCausalLM, InstellaModel, lambda t: t.pop("layers.0.mlp.up_proj.weight"),
         "missing_keys: ['model.layers.0.mlp.up_proj"),
        (InstellaModel, InstellaForCausalLM, lambda t: t.pop("model.embed_tokens.weight"),
         "missing_keys: ['embed_tokens.weight']"),
    ],
)  # fmt: skip
def test_checkpoint_that_does_not_match_is_an_error(tmp_path, cls, saved, edit, message):
    seeded(saved).save_pretrained(tmp_path)
    _edit_checkpoint(tmp_path, edit)
    with pytest.raises(ValueError, match=re.escape(message)) as error:
        cls.from_pretrained(tmp_path)
    assert "convert_checkpoint.py to-hub" in str(error.value)


def test_mis_shaped_checkpoint_is_an_error_unless_ignore_mismatched_sizes(tmp_path):
    seeded(InstellaForCausalLM).save_pretrained(tmp_path)
    _edit_checkpoint(tmp_path, lambda t: t.update({"model.norm.weight": torch.ones(32)}))
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):  # transformers' own error, already strict
        InstellaForCausalLM.from_pretrained(tmp_path)
    model = InstellaForCausalLM.from_pretrained(tmp_path, ignore_mismatched_sizes=True)
    assert model.model.norm.weight.shape == (64,)


def test_strict_loading_relaxes_narrowly_with_transformers_own_mechanisms(tmp_path):
    """The documented narrow ways (modeling_instella.py's docstring): regexes of keys that may be missing or extra on
    a subclass, and `key_mapping` for renamed keys; every other difference is still an error, unlike
    `ignore_mismatched_sizes=True`, which turns the whole check off."""

    def edit(tensors):
        tensors.pop("model.layers.1.self_attn.q_norm.weight")  # a checkpoint without one QK-norm weight
        tensors["extra.step_counter"] = torch.zeros(1)  # bookkeeping the class does not have
        tensors["model.layers.0.mlp.upproj.weight"] = tensors.pop("model.layers.0.mlp.up_proj.weight")  # renamed

    saved = seeded(InstellaForCausalLM)
    saved.save_pretrained(tmp_path)
    _edit_checkpoint(tmp_path, edit)

    class Lenient(InstellaForCausalLM):
        _keys_to_ignore_on_load_missing = [r"self_attn\.[qk]_norm\.weight$"]
        _keys_to_ignore_on_load_unexpected = [r"^extra\."]

    with pytest.raises(ValueError, match="key_mapping=") as error:  # the message names the narrow ways
        InstellaForCausalLM.from_pretrained(tmp_path)
    assert "q_norm" in str(error.value) and "extra.step_counter" in str(error.value)
    with pytest.raises(ValueError, match=r"missing_keys: \['model.layers.0.mlp.up_proj.weight'\]"):
        Lenient.from_pretrained(tmp_path)  # the renamed key is not among the allowed differences
    model = Lenient.from_pretrained(tmp_path, key_mapping={r"mlp\.upproj\.": "mlp.up_proj."})
    torch.testing.assert_close(model.model.layers[0].mlp.up_proj.weight, saved.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(model.model.layers[1].self_attn.q_norm.weight, torch.ones(64))  # initialised, as documented


# 4. Conventions shared with Llama and OLMo-2 ----------------------------------------------------------------------

SHARED_FLAGS = [
    "base_model_prefix",
    "supports_gradient_checkpointing",
    "_skip_keys_device_placement",
    "_supports_flash_attn",  # GPU: test_sft_train.py::test_packed_and_padded_agree_with_flash_attention
    "_supports_sdpa",  # test_modeling_features.py, test_modeling_parity.py
    "_supports_flex_attn",  # test_flex_attention_matches_eager (GPU)
    "_can_compile_fullgraph",  # test_modeling_compile.py::test_training_forward_compiles_fullgraph
    "_supports_attention_backend",  # test_registered_attention_function_is_used
]


@pytest.mark.parametrize("flag", SHARED_FLAGS)
def test_pretrained_model_flags_are_llamas_and_olmo2s(flag):
    assert getattr(InstellaPreTrainedModel, flag) == getattr(LlamaPreTrainedModel, flag)
    assert getattr(InstellaPreTrainedModel, flag) == getattr(Olmo2PreTrainedModel, flag)


def test_module_names_in_conventions_are_the_models_classes():
    model = seeded(InstellaForCausalLM)
    classes = {type(m).__name__: type(m) for m in model.modules()}
    assert InstellaPreTrainedModel._no_split_modules == ["InstellaDecoderLayer"]
    assert classes["InstellaDecoderLayer"] is InstellaDecoderLayer  # the unit FSDP / device_map must not split
    assert InstellaPreTrainedModel._can_record_outputs == {
        "hidden_states": InstellaDecoderLayer,
        "attentions": InstellaAttention,
    }
    assert classes["InstellaAttention"] is InstellaAttention
    assert model.base_model is model.model and model.base_model_prefix == "model"


def test_untied_head_unlike_llama():
    model = seeded(InstellaForCausalLM)
    assert InstellaForCausalLM._tied_weights_keys == {} and not model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()


def test_parallel_plans_are_olmo2s_and_cover_the_model():
    """The causal LM's plans are Llama's (= OLMo-2's); the base plans are OLMo-2's, whose q/k/v gather their output
    because the QK-norm spans all heads (Llama's plain colwise would normalise each shard alone)."""
    for attr in ("_tp_plan", "_pp_plan", "_fsdp_plan"):
        assert getattr(InstellaForCausalLM, attr) == getattr(LlamaForCausalLM, attr) == getattr(Olmo2ForCausalLM, attr)
    config = tiny_config()
    assert config.base_model_tp_plan == Olmo2Config.base_model_tp_plan != LlamaConfig.base_model_tp_plan
    assert config.base_model_pp_plan == Olmo2Config.base_model_pp_plan == LlamaConfig.base_model_pp_plan
    model = seeded(InstellaForCausalLM)
    modules = dict(model.named_modules())
    generic = {re.sub(r"\.\d+\.", ".*.", name) for name in modules}
    assert set(model._tp_plan) <= generic  # every rule names a module
    linear = {re.sub(r"\.\d+\.", ".*.", n) for n, m in modules.items() if isinstance(m, torch.nn.Linear)}
    assert linear <= set(model._tp_plan)  # every projection is sharded
    assert set(model._pp_plan) <= set(modules)


def test_registered_attention_function_is_used():
    calls = []

    def counting_sdpa(*args, **kwargs):
        calls.append(1)
        return sdpa_attention_forward(*args, **kwargs)

    AttentionInterface.register("instella_test_counting", counting_sdpa)
    model = seeded(InstellaForCausalLM)
    ids = torch.randint(2, 512, (2, 8))
    with torch.no_grad():
        eager = model(ids).logits
        model.set_attn_implementation("instella_test_counting")
        assert torch.allclose(model(ids).logits, eager, atol=1e-5)
    assert len(calls) == 2  # once per layer


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="flex attention is for GPUs (on CPU it compiles ~35 s)")
def test_flex_attention_matches_eager():
    model = seeded(InstellaForCausalLM).cuda()
    ids = torch.randint(2, 512, (2, 16), device="cuda")
    with torch.no_grad():
        eager = model(ids).logits
        model.set_attn_implementation("flex_attention")
        assert (model(ids).logits - eager).abs().max() < 1e-4
