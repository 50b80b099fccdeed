"""GRPO through the optimizer feature every training stage carries (`trainer/features/optimizer.py`): AdamW decay on
every parameter as VERL's FSDP worker builds it (`fsdp_workers.py` L312-316: `AdamW(actor_module.parameters(),
weight_decay=...)`, one group, RMSNorm weights `q_norm` / `k_norm` / `model.norm` included), with the recipe's betas,
epsilon and clipping; transformers' default would leave the norms and biases undecayed."""

import copy

import torch
from datasets import Dataset

from instella_recipes.post_training.grpo import CheckedGRPOConfig, InstellaGRPOTrainer, final_answer_reward
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.weights import load_pretrained
from modeling_instella import InstellaForCausalLM


def test_grpo_decays_every_parameter_norms_included_with_the_recipes_adamw(tmp_path, tiny_model_dir, tiny_tokenizer):
    args = CheckedGRPOConfig(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
        per_device_train_batch_size=2, beta=0.001, use_bias_correction_kl=False, loss_type="bnpo",
        weight_decay=0.01, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, max_grad_norm=1.0, max_steps=1,
    )  # fmt: skip
    model = load_pretrained(InstellaForCausalLM.from_pretrained, tiny_model_dir, "model")
    rows = Dataset.from_list([{"prompt": [{"role": "user", "content": "1+1?"}], "ground_truth": "2"}] * 2)
    trainer = InstellaGRPOTrainer(
        model=model, reward_funcs=[final_answer_reward], args=args, train_dataset=rows,
        processing_class=install_chat_template(copy.deepcopy(tiny_tokenizer)),
    )  # fmt: skip
    optimizer = trainer.create_optimizer()
    decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] == 0.01 for p in g["params"]}
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    assert {id(p) for p in model.parameters() if p.requires_grad} == decayed  # every parameter, none at 0
    assert any(n.endswith("self_attn.q_norm.weight") for n in names) and "model.norm.weight" in names
    assert isinstance(optimizer, torch.optim.AdamW)
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.999) and group["eps"] == 1e-8 and trainer.args.max_grad_norm == 1.0
    assert trainer.fsdp_reduce_dtype == "float32"  # the fp32 reduce feature (acts under FSDP + bf16 only)
