"""Sizing CLI: SPEC.md numbers for Instella-3B, alignment flags, vocab padding, memory model, bad input."""

import json

import pytest

from instella_recipes.systems import sizing
from instella_recipes.systems.sizing import Cluster, memory_per_gpu, pad_to, resolve_config, size
from instella_recipes.trainer.flops import count_params_from_config


def run(capsys, *argv):
    sizing.main(list(argv))
    return capsys.readouterr().out


def test_instella_3b_report_matches_spec(capsys):
    report = json.loads(
        run(
            capsys,
            "--model",
            "instella-3b",
            "--nodes",
            "16",
            "--tokenizer_vocab",
            "50280",
            "--target_mfu",
            "0.5",
            "--json",
        )  # fmt: skip
    )
    assert report["params"]["total"] == 3_112_675_840 and report["params"]["active"] == 3_112_675_840
    assert report["flops_per_token"] == 22_433_233_920
    assert report["vocab"]["pad_64"] == 50304 and report["vocab"]["pad_256"] == 50432
    assert report["tokens_per_second"]["H200"]["per_gpu"] == pytest.approx(22_043, rel=1e-3)  # SPEC.md 6
    assert report["tokens_per_second"]["MI300X"]["cluster"] == pytest.approx(0.5 * 1307e12 * 128 / 22_433_233_920)
    gemms = {g["name"]: g for g in report["gemms"]}
    assert gemms["attention QK^T"]["flags"] == "K=80 not /64/128/256"  # head_dim 80
    assert gemms["mlp gate / up"]["flags"] == "ok" and gemms["lm_head"]["flags"] == "N=50304 not /256"
    text = run(capsys, "--model", "instella-3b", "--tokenizer_vocab", "50280")
    assert "tokenizer 50,280 -> pad to 50,304" in text and "| head_dim | 80 | not /64/128/256 |" in text


def test_memory_model_shards_as_documented():
    config = resolve_config("instella-3b")
    counts = count_params_from_config(config)
    memory = memory_per_gpu(config, counts, Cluster(nodes=16, gpus_per_node=8))
    p = counts.total
    assert memory["DDP"]["optimizer"] == pytest.approx(p * 8 / 1e9)
    assert memory["ZeRO-1"]["optimizer"] == pytest.approx(p * 8 / 128 / 1e9)
    assert memory["FSDP full shard"]["gradients"] == pytest.approx(p * 4 / 128 / 1e9)
    assert memory["FSDP hybrid shard"]["gradients"] == pytest.approx(p * 4 / 8 / 1e9)
    # the same activations everywhere, plus autocast's bf16 copy of the fp32 weights where they are not sharded
    fsdp = memory["FSDP full shard"]["activations"]
    assert memory["FSDP hybrid shard"]["activations"] == pytest.approx(fsdp)
    assert (
        memory["DDP"]["activations"]
        == pytest.approx(memory["ZeRO-1"]["activations"])
        == pytest.approx(fsdp + p * 2 / 1e9)
    )


def test_zaya_recipe_counts_active_experts_only():
    report = size(resolve_config("recipes/zaya1/zaya1_base_mi300x.yaml"), Cluster(seq_len=4096))
    params = report["params"]
    assert params["total"] - params["embedding"] == 8_303_355_728  # SPEC.md 5: 8.3B (without the embedding)
    assert 0.75e9 < params["active"] - params["embedding"] < 0.77e9  # SPEC.md 5: 760M active
    assert params["routed_experts"] == 40 * 16 * 3 * 2048 * 2048


def test_bad_input_is_clear(capsys):
    for argv, message in (
        (["--model", "gpt-5"], "neither a preset"),
        (["--nodes", "0"], "nodes must be >= 1, got 0"),
        (["--target_mfu", "1.5"], "target_mfu must be in (0, 1], got 1.5"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            sizing.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert pad_to(50280, 64) == 50304


def test_sequence_length_defaults_to_the_models_context(capsys, tiny_model_dir):
    """The tiny model's context is 256: sizing it at 4096 tokens would describe a run it cannot do."""
    report = json.loads(run(capsys, "--model", str(tiny_model_dir), "--json"))
    assert report["seq_len"] == 256 and report["cluster"]["seq_len"] == 256
    assert json.loads(run(capsys, "--model", "instella-3b", "--json"))["seq_len"] == 4096
    assert json.loads(run(capsys, "--model", "amd-llama-135m", "--json"))["seq_len"] == 2048
    text = run(capsys, "--model", str(tiny_model_dir))
    assert "parameters (" in text and "0.000B" not in text  # a toy model's heading in K/M, not 0.000B


def test_lora_memory_counts_adapters_as_peft_builds_them(tiny_model_dir):
    """The LoRA row of the one-GPU fine-tune (docs/finetune_one_gpu.md): a frozen bf16 base, fp32 adapters with
    gradients and AdamW state; the adapter count equals PEFT's own on the same model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from instella_recipes.systems.sizing import LORA_TARGETS, lora_params

    config = resolve_config(str(tiny_model_dir))
    peft_model = get_peft_model(
        AutoModelForCausalLM.from_config(config), LoraConfig(r=8, target_modules=list(LORA_TARGETS))
    )
    trainable = sum(p.numel() for p in peft_model.parameters() if p.requires_grad)
    assert lora_params(config, 8) == trainable

    big = resolve_config("instella-3b")
    counts = count_params_from_config(big)
    cluster = Cluster(gpus_per_node=1, seq_len=2048, weight_bytes=2, lora_r=16)
    ddp = memory_per_gpu(big, counts, cluster)["DDP"]
    adapters = lora_params(big, 16)
    assert ddp["weights"] == pytest.approx((counts.total * 2 + adapters * 4) / 1e9)
    assert ddp["gradients"] == pytest.approx(adapters * 4 / 1e9) and ddp["optimizer"] == pytest.approx(
        adapters * 8 / 1e9
    )


def test_long_context_grid_hand_computed(capsys):
    """Instella-3B (h 2560, 36 layers, 32 heads x 80, intermediate 6912, vocab 50304) at 64K with SP 4 and
    activation checkpointing: 16,384 tokens per GPU x (36 x 2560 x 4 + 41,216 x 2 + 50,304 x 9) bytes (fp32 layer
    inputs, one layer's bf16 full set, the loss's 9 bytes per logit), where 41,216 = 4 x 2560 + (32 + 64) x 80 +
    32 x 80 + 3 x 6912 is one layer's full set per token."""
    rows = json.loads(run(capsys, "--model", "instella-3b", "--nodes", "8", "--long_context", "true", "--json"))
    grid = {(r["seq_len"], r["sequence_parallel"], r["gpu"]): r for r in rows}
    assert len(grid) == 2 * 4 * 2
    row = grid[(65536, 4, "MI300X")]
    assert row["activations_gb_checkpointing"] == pytest.approx(16384 * (368_640 + 82_432 + 452_736) / 1e9)  # 14.81 GB
    # SP divides the activations exactly; weights/grads/AdamW (FSDP over 64 GPUs) do not change with SP
    sp1, sp8 = grid[(262144, 1, "H100")], grid[(262144, 8, "H100")]
    assert sp1["activations_gb_checkpointing"] == pytest.approx(8 * sp8["activations_gb_checkpointing"])
    assert sp1["memory_gb_checkpointing"] - sp1["activations_gb_checkpointing"] == pytest.approx(
        sp8["memory_gb_checkpointing"] - sp8["activations_gb_checkpointing"]
    )
    # phase 1 step: 64 x 65,536 tokens x (6 x 2,983,897,600 + 12 x 36 x 2560 x 65,536) / (64 x 1307e12 x 0.4)
    flops_token = 6 * 2_983_897_600 + 12 * 36 * 2560 * 65536
    assert row["seconds_per_step"] == pytest.approx(64 * 65536 * flops_token / (64 * 1307e12 * 0.4))  # 11.33 s
    assert grid[(65536, 1, "H100")]["seconds_per_step"] == pytest.approx(row["seconds_per_step"] * 1307 / 989)
    # the authors' phase 2 (256K, SP 4) fits an MI300X with checkpointing; 256K without SP does not fit an H100
    assert grid[(262144, 4, "MI300X")]["fits_checkpointing"] and not sp1["fits_checkpointing"]
    text = run(capsys, "--model", "instella-3b", "--nodes", "8", "--long_context", "true")
    assert "| 262,144 | 4 | MI300X |" in text


def test_sequence_parallel_must_divide_heads_and_length(capsys):
    with pytest.raises(SystemExit) as exit_info:
        sizing.main(["--model", "instella-3b", "--seq_len", "4096", "--sequence_parallel", "3"])
    assert exit_info.value.code == 2 and "seq_len 4096 is not divisible by sequence_parallel_size 3" in (
        capsys.readouterr().err
    )


FINETUNE = dict(micro_batch=4, seq_len=2048, logit_bytes=4, accumulation=8)
# Peak GPU memory measured on one H200 (torch.cuda.max_memory_allocated, GiB), ../shared/GPU_BASELINE.md (2026-11-28,
# benchmarks/bench_gpu.py at 43a9f8b): Instella-3B, fp32 masters, bf16 autocast, AdamW, activation checkpointing.
H200_PEAKS_GIB = {
    "long 32K": (dict(seq_len=32768), 68.3),
    "long 64K": (dict(seq_len=65536), 96.2),
    # the one-GPU fine-tune recipes through TRL's SFTTrainer (its fused LM head), 4 x 2048 tokens x 8 accumulation
    "finetune LoRA": (
        dict(micro_batch=4, seq_len=2048, weight_bytes=2, lora_r=16, logit_bytes=4, accumulation=8),
        9.8,
    ),
    "finetune full": (dict(micro_batch=4, seq_len=2048, logit_bytes=4, accumulation=8), 55.8),
}


@pytest.mark.parametrize("case", list(H200_PEAKS_GIB))
def test_memory_model_is_within_5_percent_of_the_measured_h200_peaks(case):
    shape, measured = H200_PEAKS_GIB[case]
    config = resolve_config("instella-3b")
    cluster = Cluster(gpus_per_node=1, activation_checkpointing=True, **shape)
    estimate_gib = memory_per_gpu(config, count_params_from_config(config), cluster)["DDP"]["total"] * 1e9 / 2**30
    assert estimate_gib == pytest.approx(measured, rel=0.05), (case, estimate_gib, measured)
