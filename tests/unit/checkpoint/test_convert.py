"""Training-format (OLMo) <-> Hub-format checkpoints: exact key mapping, bit-exact round trip, streaming CLI."""

import pytest
import torch

from instella_recipes.checkpoint.convert import convert_state_dict, main
from modeling_instella import InstellaConfig, InstellaForCausalLM
from tests.conftest import tiny_config


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return InstellaForCausalLM(tiny_config(num_key_value_heads=2)).eval()


def test_fused_layout_is_q_k_v_and_up_then_gate(model):
    hub = model.state_dict()
    training = convert_state_dict(hub, model.config, to="training")
    att = training["transformer.blocks.1.att_proj.weight"]
    q, k, v = (hub[f"model.layers.1.self_attn.{n}_proj.weight"] for n in "qkv")
    assert att.shape == (64 + 32 + 32, 64) and torch.equal(att, torch.cat([q, k, v]))
    ff = training["transformer.blocks.0.ff_proj.weight"]
    up, gate = hub["model.layers.0.mlp.up_proj.weight"], hub["model.layers.0.mlp.gate_proj.weight"]
    assert torch.equal(ff, torch.cat([up, gate]))
    assert torch.equal(training["transformer.ff_out.weight"], hub["lm_head.weight"])
    assert torch.equal(training["transformer.blocks.0.ff_out.weight"], hub["model.layers.0.mlp.down_proj.weight"])
    assert len(training) == 3 + 2 * 8


def test_round_trip_is_bit_exact(model):
    hub = model.state_dict()
    back = convert_state_dict(convert_state_dict(hub, model.config, to="training"), model.config, to="hub")
    assert back.keys() == hub.keys()
    assert all(torch.equal(back[k], hub[k]) for k in hub)


def test_reconfigure_copies_the_weights_with_a_new_rope(tmp_path, model):
    """Instella-Long's start point: the Instruct checkpoint with rope_theta 514,640 and 65,536 positions."""
    model.save_pretrained(tmp_path / "instruct")
    argv = ["reconfigure", "--input", str(tmp_path / "instruct"), "--output", str(tmp_path / "start"),
            "--rope_theta", "514640", "--max_position_embeddings", "65536"]  # fmt: skip
    assert main(argv) == 0
    config = InstellaConfig.from_pretrained(tmp_path / "start")
    assert config.rope_parameters["rope_theta"] == 514_640 and config.max_position_embeddings == 65_536
    again = InstellaForCausalLM.from_pretrained(tmp_path / "start")
    for (name, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(SystemExit) as err:  # a reconfigure that changes nothing is a mistake, named
        main(["reconfigure", "--input", str(tmp_path / "instruct"), "--output", str(tmp_path / "again")])
    assert err.value.code == 2


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]


def test_reconfigure_copies_the_tokenizer(tmp_path, model, tiny_tokenizer):
    from transformers import AutoTokenizer

    model.save_pretrained(tmp_path / "instruct")
    tiny_tokenizer.save_pretrained(tmp_path / "instruct")
    argv = ["reconfigure", "--input", str(tmp_path / "instruct"), "--output", str(tmp_path / "start"),
            "--max_position_embeddings", "512"]  # fmt: skip
    assert main(argv) == 0
    assert (tmp_path / "start" / "tokenizer_config.json").is_file()
    assert (
        AutoTokenizer.from_pretrained(tmp_path / "start")("The capital of").input_ids
        == tiny_tokenizer("The capital of").input_ids
    )


def test_reconfigure_refuses_a_checkpoint_of_another_model_type(tmp_path, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(llama).save_pretrained(tmp_path / "draft")
    argv = ["reconfigure", "--input", str(tmp_path / "draft"), "--output", str(tmp_path / "out"),
            "--max_position_embeddings", "512"]  # fmt: skip
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    (line,) = _errors(capsys)
    assert f"{tmp_path / 'draft' / 'config.json'}: model_type 'llama'" in line and "Instella checkpoints only" in line
    assert not (tmp_path / "out").exists()


def test_reconfigure_of_a_missing_folder_names_it(tmp_path, capsys):
    argv = ["reconfigure", "--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"),
            "--rope_theta", "514640"]  # fmt: skip
    with pytest.raises(SystemExit) as err:
        main(argv)
    assert err.value.code == 2
    (line,) = _errors(capsys)
    assert (
        line == f"error: --input {tmp_path / 'nowhere'} does not exist: give the checkpoint file or folder to convert"
    )
