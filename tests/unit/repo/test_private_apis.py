"""Canaries for the private library APIs we still use (each use carries a `# private: ... [test_private_apis]` line
saying why no public API serves). Each test checks the name, the signature and the behaviour our code relies on, so
an upgrade that renames or changes one fails here, naming the library version and our code that needs a fix, rather
than as a wrong number deep inside a run. Fast: no training, no model bigger than a few parameters."""

import argparse
import inspect
import os
import sys
from dataclasses import dataclass, field
from datetime import timedelta

import datasets
import lm_eval
import pytest
import torch
import transformers
import trl

from tests.conftest import tiny_config


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _check(ok: bool, library: str, what: str, users: str) -> None:
    """Fail with a message that says which private API changed, in which installed version, and what uses it."""
    versions = {"transformers": transformers, "trl": trl, "torch": torch, "datasets": datasets, "lm_eval": lm_eval}
    version = getattr(versions.get(library), "__version__", sys.version.split()[0])
    assert ok, f"private API changed in {library} {version}: {what}. Used by {users}: port it to the new API."


def _calls(function, name: str) -> bool:
    return f"{name}(" in inspect.getsource(function)


# --- transformers Trainer -------------------------------------------------------------------------------------------
def test_trainer_checkpoint_and_grad_norm_hooks():
    from transformers import Trainer

    users = "pretraining/pretrain_trainer.py PretrainTrainer"
    _check(
        _params(Trainer._save_checkpoint) == ["self", "model", "trial"],
        "transformers",
        "Trainer._save_checkpoint(model, trial)",
        users,
    )
    # PretrainTrainer stages a checkpoint by pointing args.output_dir elsewhere while the Trainer saves
    _check(
        _calls(Trainer._save_checkpoint, "self._get_output_dir")
        and "self.args.output_dir" in inspect.getsource(Trainer._get_output_dir),
        "transformers",
        "Trainer._save_checkpoint writes under args.output_dir (via _get_output_dir)",
        users,
    )
    _check(
        _params(Trainer._get_grad_norm) == ["self", "model", "grad_norm"],
        "transformers",
        "Trainer._get_grad_norm(model, grad_norm=None)",
        users,
    )
    # the skip of a non-finite step relies on the norm being computed before the optimizer steps
    module = inspect.getsource(sys.modules[Trainer.__module__])
    norm_at = module.find("self._get_grad_norm(")
    step_at = module.find("self.optimizer.step()", max(norm_at, 0))
    _check(
        norm_at > -1 and 0 < step_at - norm_at < 1000,
        "transformers",
        "the training loop calls _get_grad_norm just before optimizer.step()",
        users,
    )


def test_trainer_sampler_columns_scheduler_and_loss_flags():
    from transformers import Trainer

    users = "PretrainTrainer (pretraining/pretrain_trainer.py), InstellaOptimMixin (trainer/features/optimizer.py)"
    _check(
        _params(Trainer._get_train_sampler) == ["self", "train_dataset"],
        "transformers",
        "Trainer._get_train_sampler(train_dataset=None)",
        users,
    )
    _check(
        _params(Trainer._set_signature_columns_if_needed) == ["self"]
        and "self._signature_columns" in inspect.getsource(Trainer._set_signature_columns_if_needed)
        and "self._signature_columns = None" in inspect.getsource(Trainer.__init__),
        "transformers",
        "Trainer._set_signature_columns_if_needed fills self._signature_columns (None until then)",
        users,
    )
    module = inspect.getsource(sys.modules[Trainer.__module__])
    _check(
        "self._created_lr_scheduler = False" in module and "if self._created_lr_scheduler:" in module,
        "transformers",
        "Trainer._created_lr_scheduler (drop the scheduler it made before a new train())",
        users,
    )
    _check(
        "self._loss_shifts_labels = " in inspect.getsource(Trainer.__init__)
        and "if self._loss_shifts_labels" in module,
        "transformers",
        "Trainer._loss_shifts_labels (count input tokens, not shifted labels, for the loss normaliser)",
        users,
    )


def test_config_names_the_attention_set_on_the_model():
    from modeling_instella import InstellaForCausalLM

    model = InstellaForCausalLM(tiny_config())
    model.set_attn_implementation("eager")
    _check(
        model.config._attn_implementation == "eager",
        "transformers",
        "config._attn_implementation follows set_attn_implementation",
        "trainer/features/sequence_parallel.py (the Ulysses wrapper), modeling_instella.py (the varlen-boundary mask)",
    )


def test_sequence_parallel_loss_count_and_dataloader_list():
    from accelerate import Accelerator
    from transformers import Trainer

    users = "SequenceParallelMixin (trainer/features/sequence_parallel.py)"
    _check(
        _params(Trainer._get_num_items_in_batch) == ["self", "batch_samples", "device"]
        and _calls(Trainer.get_batch_samples, "self._get_num_items_in_batch"),
        "transformers",
        "Trainer._get_num_items_in_batch(batch_samples, device) counts the loss normaliser of a step",
        users,
    )
    _check(
        "self._dataloaders.append(prepared_data_loader)" in inspect.getsource(Accelerator.prepare_data_loader),
        "accelerate",
        "Accelerator._dataloaders (the prepared dataloaders it checkpoints)",
        users,
    )


def test_trainer_num_items_in_batch_hook_and_sft_divisor():
    """`loss_reduction: sum` (trainer/features/loss_reduction.py) returns 1 from `_get_num_items_in_batch`: the
    Trainer must still ask that method for the divisor and hand it to compute_loss, and TRL's SFT loss must divide the
    token sum by it; `loss_is_scaled_for_ga = False` must still make training_step divide by the accumulation steps."""
    from transformers import Trainer
    from trl import SFTTrainer

    users = "LossReductionMixin (trainer/features/loss_reduction.py), SFT's loss_reduction: sum and input_tokens"
    _check(
        _params(Trainer._get_num_items_in_batch) == ["self", "batch_samples", "device"]
        and "self._get_num_items_in_batch(" in inspect.getsource(Trainer.get_batch_samples),
        "transformers",
        "Trainer.get_batch_samples -> self._get_num_items_in_batch(batch_samples, device)",
        users,
    )
    _check(
        "if self.loss_is_scaled_for_ga is not None:" in inspect.getsource(Trainer.training_step)
        and "loss = loss / self.current_gradient_accumulation_steps" in inspect.getsource(Trainer.training_step),
        "transformers",
        "Trainer.training_step honours loss_is_scaled_for_ga (False: divide by the accumulation steps)",
        users,
    )
    _check(
        "per_token_loss.sum() / torch.as_tensor(num_tokens)" in inspect.getsource(SFTTrainer.compute_loss),
        "trl",
        "SFTTrainer.compute_loss divides the token sum by num_items_in_batch",
        users,
    )


# --- TRL ------------------------------------------------------------------------------------------------------------
def test_dpo_trainer_prepare_dataset_hook():
    from trl import DPOTrainer

    users = "post_training/dpo.py InstellaDPOTrainer"
    _check(
        _params(DPOTrainer._prepare_dataset) == ["self", "dataset", "processing_class", "args", "dataset_name"],
        "trl",
        "DPOTrainer._prepare_dataset(dataset, processing_class, args, dataset_name)",
        users,
    )
    _check(
        _calls(DPOTrainer.__init__, "self._prepare_dataset"),
        "trl",
        "DPOTrainer.__init__ tokenises through self._prepare_dataset",
        users,
    )
    _check(
        _params(DPOTrainer._set_signature_columns_if_needed) == ["self"],
        "trl",
        "DPOTrainer._set_signature_columns_if_needed()",
        users,
    )


def test_grpo_trainer_reward_advantage_and_loss_hooks():
    from trl import GRPOTrainer

    users = "post_training/grpo.py InstellaGRPOTrainer (VERL's advantage epsilon and KL clamp)"
    _check(
        _params(GRPOTrainer._calculate_rewards) == ["self", "inputs", "prompts", "completions", "completion_ids_list"]
        and "return rewards_per_func" in inspect.getsource(GRPOTrainer._calculate_rewards),
        "trl",
        "GRPOTrainer._calculate_rewards(inputs, prompts, completions, completion_ids_list) -> rewards_per_func",
        users,
    )
    generate = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    _check(
        _params(GRPOTrainer._generate_and_score_completions) == ["self", "inputs"]
        and _calls(GRPOTrainer._generate_and_score_completions, "self._calculate_rewards")
        and '"advantages": advantages' in generate
        and "advantages[process_slice]" in generate,
        "trl",
        "_generate_and_score_completions(inputs) computes rewards with _calculate_rewards and returns this process's "
        "slice of the advantages under 'advantages'",
        users,
    )
    loss = inspect.getsource(GRPOTrainer._compute_loss)
    _check(
        _params(GRPOTrainer._compute_loss) == ["self", "model", "inputs"]
        and _calls(GRPOTrainer._compute_loss, "self._get_per_token_logps_and_entropies")
        and "if self.beta != 0.0:" in loss
        and "loss = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)" in loss
        and "self.current_gradient_accumulation_steps" in loss,
        "trl",
        "_compute_loss(model, inputs): one policy forward through _get_per_token_logps_and_entropies, its KL term "
        "only when self.beta != 0, bnpo = token mean over the micro-batch divided by gradient accumulation",
        users,
    )


def test_trl_vllm_generation_weight_walk():
    from trl.generation.vllm_generation import VLLMGeneration

    users = "post_training/grpo.py ReloadingVLLMGeneration (colocated vLLM newer than TRL's tested range)"
    sync = inspect.getsource(VLLMGeneration.sync_weights)
    _check(
        _params(VLLMGeneration._iter_named_params) == ["self"]
        and "for name, param in self._iter_named_params():" in sync
        and 'self.llm.wake_up(tags=["weights"])' in sync
        and "self.llm.reset_prefix_cache()" in sync,
        "trl",
        "VLLMGeneration.sync_weights: wake the weights (sleep mode), push _iter_named_params() (name, tensor) pairs, "
        "reset the prefix cache",
        users,
    )


# --- transformers generation and models ----------------------------------------------------------------------------
def test_assisted_generation_builds_its_generator_in_get_candidate_generator():
    from transformers.generation import AssistedCandidateGenerator, GenerationMixin

    from instella_recipes.evaluation.speculative import DraftLoopCandidateGenerator

    users = "evaluation/speculative.py count_drafts / DraftLoopCandidateGenerator"
    module = inspect.getsource(sys.modules[GenerationMixin.__module__])
    _check(
        hasattr(GenerationMixin, "_get_candidate_generator") and "self._get_candidate_generator(" in module,
        "transformers",
        "generate() builds its candidate generator with self._get_candidate_generator(...)",
        users,
    )
    _check(
        _params(AssistedCandidateGenerator._generate_candidates) == ["self", "generation_args"]
        and _calls(AssistedCandidateGenerator.get_candidates, "self._generate_candidates"),
        "transformers",
        "AssistedCandidateGenerator.get_candidates drafts through self._generate_candidates(generation_args)",
        users,
    )
    prepare = inspect.getsource(AssistedCandidateGenerator)
    _check(
        '"max_new_tokens"' in prepare and '"min_new_tokens"' in prepare,
        "transformers",
        "the draft's generation_args carry max_new_tokens and min_new_tokens",
        users,
    )
    init = inspect.getsource(AssistedCandidateGenerator.__init__)
    for attribute in (
        "assistant_model",
        "assistant_kwargs",
        "generation_config",
        "assistant_generation_config",
        "logits_processor",
        "input_ids_key",
    ):
        _check(
            f"self.{attribute} =" in init, "transformers", f"AssistedCandidateGenerator sets self.{attribute}", users
        )
    # the __class__ swap is only sound while the subclass adds no state of its own
    _check(
        not {"__init__", "__slots__"} & set(vars(DraftLoopCandidateGenerator)),
        "our code",
        "DraftLoopCandidateGenerator must add no __init__/__slots__ (count_drafts swaps __class__)",
        users,
    )


def test_attention_implementation_check_is_the_one_our_model_overrides():
    from transformers import PreTrainedModel

    from modeling_instella import InstellaForCausalLM

    users = "modeling_instella InstellaPreTrainedModel._check_and_adjust_attn_implementation"
    params = _params(PreTrainedModel._check_and_adjust_attn_implementation)
    _check(
        params[:3] == ["self", "attn_implementation", "is_init_check"],
        "transformers",
        "PreTrainedModel._check_and_adjust_attn_implementation(attn_implementation, is_init_check, ...)",
        users,
    )
    model = InstellaForCausalLM(tiny_config())
    seen = []
    original = InstellaForCausalLM._check_and_adjust_attn_implementation

    def spy(self, attn_implementation, *args, **kwargs):
        seen.append(attn_implementation)
        return original(self, attn_implementation, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(InstellaForCausalLM, "_check_and_adjust_attn_implementation", spy)
        model.set_attn_implementation("eager")
    _check(seen == ["eager"], "transformers", "set_attn_implementation passes through the check we override", users)


# --- torch ----------------------------------------------------------------------------------------------------------
def test_dcp_unflatten_state_dict_restores_the_nesting():
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict

    users = "checkpoint/reshape.py reshard"
    nested = {"model": {"w": torch.ones(2)}, "optim": {"state": {"w": {"step": torch.tensor(3.0)}}, "lr": [0.1]}}
    flat, mapping = flatten_state_dict(nested)
    _check(
        _params(unflatten_state_dict)[:2] == ["state_dict", "mapping"],
        "torch",
        "torch.distributed.checkpoint._nested_dict.unflatten_state_dict(state_dict, mapping)",
        users,
    )
    back = unflatten_state_dict(flat, mapping)
    _check(
        back.keys() == nested.keys()
        and torch.equal(back["model"]["w"], nested["model"]["w"])
        and back["optim"]["state"]["w"]["step"].item() == 3.0,
        "torch",
        "unflatten_state_dict(flat, planner_data) gives back the nested dict",
        users,
    )


def test_gloo_group_timeout_can_be_set_after_start():
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _set_pg_timeout

    users = "pretraining/pretrain_trainer.py apply_collective_timeout"
    _check(
        _params(_set_pg_timeout) == ["timeout", "group"],
        "torch",
        "torch.distributed.distributed_c10d._set_pg_timeout(timeout, group=None)",
        users,
    )
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        _set_pg_timeout(timedelta(seconds=7))  # raises if the gloo backend no longer takes a timeout
        t = torch.ones(1)
        dist.all_reduce(t)
        _check(t.item() == 1.0, "torch", "the group works after _set_pg_timeout", users)
    finally:
        dist.destroy_process_group()


def test_current_graph_task_id_tells_backward_from_forward():
    users = "pretraining/moe.py _in_backward (router counts under activation checkpointing)"
    _check(
        callable(getattr(torch._C, "_current_graph_task_id", None)),
        "torch",
        "torch._C._current_graph_task_id() exists",
        users,
    )
    seen = []
    x = torch.ones(2, requires_grad=True)
    y = x * 2
    y.register_hook(lambda grad: seen.append(torch._C._current_graph_task_id()))
    outside = torch._C._current_graph_task_id()
    y.sum().backward()
    _check(
        outside == -1 and seen and seen[0] != -1,
        "torch",
        "_current_graph_task_id() is -1 outside backward and not -1 inside it",
        users,
    )


# --- datasets, lm-eval, argparse, CPython ---------------------------------------------------------------------------
def test_dataset_indices_mapping_attribute():
    users = "data/prepare.py (flatten_indices only when a mapping exists)"
    plain = datasets.Dataset.from_dict({"a": [1, 2, 3]})
    picked = plain.select([2, 0])
    combined = datasets.concatenate_datasets([plain, picked])
    _check(
        hasattr(plain, "_indices")
        and plain._indices is None
        and picked._indices is not None
        and combined._indices is not None
        and combined.flatten_indices()._indices is None,
        "datasets",
        "Dataset._indices is None exactly when no indices mapping lies over the Arrow table",
        users,
    )


def test_configurable_task_metric_tables():
    from lm_eval.api.task import ConfigurableTask

    users = "eval/tasks/olmes/olmes_task.py OlmesTask.__init__ / process_results"
    init = inspect.getsource(ConfigurableTask.__init__)
    for name in ("_metric_fn_list", "_metric_fn_kwargs", "_aggregation_list", "_higher_is_better"):
        _check(f"self.{name} = {{}}" in init, "lm_eval", f"ConfigurableTask keeps self.{name}", users)
    task = ConfigurableTask.__new__(ConfigurableTask)
    task._aggregation_list, task._higher_is_better = {"acc": len}, {"acc": True}
    _check(
        task.aggregation() == {"acc": len} and task.higher_is_better() == {"acc": True},
        "lm_eval",
        "ConfigurableTask.aggregation()/higher_is_better() return those tables",
        users,
    )


def test_argparse_lists_its_actions():
    from transformers import HfArgumentParser

    users = "core/recipe.py _option_names / _list_flags (unknown, repeated and list flags)"

    @dataclass
    class Probe:
        stages: list[str] = field(default_factory=list)
        seed: int = 0

    for parser in (HfArgumentParser([Probe]), argparse.ArgumentParser()):
        _check(
            all(isinstance(a, argparse.Action) for a in getattr(parser, "_actions", None) or [None]),
            "argparse",
            "ArgumentParser._actions lists the parser's Action objects",
            users,
        )
    actions = {o: a for a in HfArgumentParser([Probe])._actions for o in a.option_strings}
    _check(
        {"--stages", "--seed", "--help"} <= actions.keys() and actions["--stages"].nargs in ("+", "*"),
        "argparse",
        "each Action has option_strings and nargs ('+' or '*' for list fields)",
        users,
    )


def test_base_executable_names_the_real_interpreter():
    users = "sandbox/pool.py _python (the interpreter the sandbox runs, not a venv shim)"
    base = getattr(sys, "_base_executable", None)
    _check(
        isinstance(base, str) and os.path.isfile(base), "python", "sys._base_executable is an interpreter path", users
    )
