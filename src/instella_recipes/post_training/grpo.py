"""GRPO (Instella-3B-Math-SFT -> Instella-3B-Math) with TRL's GRPOTrainer, the objective as the authors ran it in
VERL: the stage's settings, its Trainer subclass and `main(argv)` (`scripts/grpo.py` is the command line).

The authors' objective ([MATH] `verl/scripts/run_grpo_multi_nodes.sh` and their VERL copy, `core_algos.py`):
PPO clip 0.2 both sides with the dual-clip cap c = 3 for negative advantages, token-mean aggregation, GRPO
advantages (r - group mean) / (Bessel std + 1e-6), k3 ("low_var_kl") KL in the loss with coefficient 0.001 clamped to
[-10, 10], temperature 1.0. TRL expresses most of it with GRPOConfig's own fields (`epsilon`, `epsilon_high`, `delta`,
`loss_type: bnpo`, `beta`, `scale_rewards: group`, `temperature`; docs/instella_math.md has the table). Two things it
cannot, each a small hook of `InstellaGRPOTrainer`:
- the advantage epsilon: TRL divides by std + 1e-4 (a constant in its code), VERL by std + 1e-6, a relative
  difference of up to 3e-4 on 0/1 rewards -> `advantage_epsilon` (the rewards TRL computed are kept and the
  advantages recomputed from them);
- the KL clamp: TRL's k3 is not clamped -> `kl_clamp`: TRL's KL term is switched off for the loss and ours, clamped
  as VERL clamps it, is added with the same token-mean aggregation (the sum of two token means over one mask equals
  the token mean of the sum).
TRL's `delta` (its "two-sided clipping": the unclipped ratio capped at delta) gives the same loss and gradient as
VERL's dual clip (tests/unit/post_training/test_exactness_grpo.py checks both against VERL's code).

Data: one user message = the problem + " " + the authors' prompt suffix; the reference answer travels as the
`ground_truth` column to the reward functions; prompts longer than `max_prompt_length` (512) tokens after the chat
template are dropped and counted (VERL's `filter_overlong_prompts`).
"""

import json
import os
import traceback
from collections import Counter
from dataclasses import dataclass, field

import torch
from accelerate import PartialState
from datasets import Dataset, concatenate_datasets
from transformers import AutoConfig
from trl import GRPOConfig, GRPOTrainer

from instella_recipes.core import (
    RecipeError,
    check_range,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    setup_logging,
)
from instella_recipes.core.checks import check_choice
from instella_recipes.data.sources import PRETRAINING_ONLY, SourceSpec, load_rows

# `final_answer_reward` stays importable here: recipes name it by its old dotted path (rewards/ is its home)
from instella_recipes.rewards import final_answer_reward, ground_truth_problem, load_reward_funcs  # noqa: F401
from instella_recipes.trainer.checks import check_fits_positions
from instella_recipes.trainer.features import dynamic_batching, fp32_reduce, optimizer, settings_mixins, trainer_mixins
from instella_recipes.trainer.settings import DATA, LAUNCH, RUN
from instella_recipes.trainer.stage import Stage, run_stage

from .grpo_signal import RewardSignal
from .shared import (
    CheckedModelConfig,
    PostTrainingData,
    PostTrainingInputs,
    check_launch,
    check_model_path,
    load_model,
    load_tokenizer_with_template,
    read_manifest_safe,
)
from .vllm_colocate import ReloadingVLLMGeneration, colocated_sync_needs_reload, restore_module_calls

logger = get_logger(__name__)

# [MATH] verl/examples/data_preprocess/{big_math,deep_math,deepscaler}.py L46-56: problem + " " + this.
PROMPT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
# The reward grader of issue 33 (the authors' Prime-RL `compute_score`); any dotted path can replace it.
DEFAULT_REWARD = "instella_recipes.rewards.reward"
GROUND_TRUTH = "ground_truth"
# GRPO's training features, in order (`trainer/features/`): Instella's optimizer, i.e. AdamW decay on every parameter
# as VERL's FSDP worker (`fsdp_workers.py` L312-316: `AdamW(actor_module.parameters(), weight_decay=...)`, norms
# included; betas, epsilon and clipping are the recipe's, as VERL's actor.optim), and the fp32 gradient reduce.
# VERL's dynamic micro-batches come first: the outermost Trainer mixin, they run TRL's slices of an update as their
# own token-balanced micro-batches (`use_dynamic_bsz`; off: TRL's fixed slices).
# `CheckedGRPOConfig`, `InstellaGRPOTrainer` and `GRPOStage` derive from this tuple.
FEATURES = (dynamic_batching.FEATURE, fp32_reduce.FEATURE, optimizer.FEATURE)


@dataclass
class CheckedGRPOConfig(PostTrainingInputs, *settings_mixins(FEATURES), GRPOConfig):
    """The GRPO stage's settings: TRL's GRPOConfig (its own names for everything TRL has: `num_generations`,
    `max_completion_length`, `beta`, `epsilon`, `epsilon_high`, `delta`, `loss_type`, ...), the post-training fields
    every post-training stage shares (`PostTrainingInputs`: `sources` (prompt sets), `tokenizer_name_or_path`,
    `chat_template_path`, `global_batch_size` (completions), `max_samples` (prompts), `max_skip_fraction`,
    `torch_num_threads`), its training features' fields, plus this stage's own: the prompt format, the reward
    functions and the VERL settings TRL has no field for (`advantage_epsilon`, `kl_clamp`; `use_dynamic_bsz`,
    `ppo_max_token_len_per_gpu`: `DynamicBatchingSettings`)."""

    # GRPOConfig's fields that define the run
    library_roles = dict.fromkeys(
        ("beta", "loss_type", "num_generations", "temperature", "max_completion_length", "epsilon", "epsilon_high",
         "delta", "scale_rewards", "top_p", "top_k", "num_iterations", "generation_batch_size",
         "use_bias_correction_kl", "mask_truncated_completions", "vllm_importance_sampling_correction"),
        RUN,
    )  # fmt: skip

    prompt_column: str = field(default="problem", metadata={"role": DATA, "help": "Column with the problem text."})
    answer_column: str = field(
        default="answer", metadata={"role": DATA, "help": "Column with the reference answer (DeepMath: final_answer)."}
    )
    prompt_suffix: str = field(
        default=PROMPT_SUFFIX, metadata={"role": RUN, "help": "Appended to each problem after a space."}
    )
    max_prompt_length: int | None = field(
        default=512,
        metadata={"role": RUN, "help": "Prompts longer than this (tokens, chat template applied) are dropped."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: [DEFAULT_REWARD],
        metadata={"role": RUN, "help": "Dotted paths of reward functions f(completions, ground_truth, **kw)."},
    )
    advantage_epsilon: float | None = field(
        default=1e-6,
        metadata={"role": RUN, "help": "Advantage = (r - mean) / (std + this), VERL's 1e-6; null: TRL's 1e-4."},
    )
    kl_clamp: float | None = field(
        default=10.0,
        metadata={"role": RUN, "help": "k3 KL clamped to [-this, this] as VERL's low_var_kl; null: TRL's unclamped."},
    )
    # PostTrainingInputs' field with GRPO's default: prompts over max_prompt_length are dropped by design (VERL's
    # filter_overlong_prompts), so far more may go than the chat stages' 1% of unusable rows.
    max_skip_fraction: float = field(
        default=0.5, metadata={"role": LAUNCH, "help": "Error if more prompts than this are dropped."}
    )
    allow_no_signal: bool = field(
        default=False,
        metadata={"role": LAUNCH, "help": "Finish even when no step had a learning signal (grpo_signal.py)."},
    )

    def __post_init__(self):
        check_range("max_prompt_length", self.max_prompt_length, 1, integer=True, allow_none=True)
        check_range("advantage_epsilon", self.advantage_epsilon, 0, low_open=True, allow_none=True)
        check_range("kl_clamp", self.kl_clamp, 0, low_open=True, allow_none=True)
        check_sampling(self)
        if not self.reward_funcs:
            raise RecipeError("reward_funcs is empty: name at least one reward function (a dotted import path)")
        if self.kl_clamp is not None and self.loss_type != "bnpo":
            raise RecipeError(
                f"kl_clamp adds the clamped KL with a token mean over the micro-batch (loss_type: bnpo, VERL's "
                f"token-mean); with loss_type '{self.loss_type}' set kl_clamp: null (TRL's unclamped KL)"
            )
        if self.kl_clamp is not None and self.use_bias_correction_kl:
            raise RecipeError(
                "kl_clamp (VERL's KL) and use_bias_correction_kl (TRL's default, which VERL does not have) exclude "
                "each other: set use_bias_correction_kl: false (the authors' objective) or kl_clamp: null"
            )
        if self.advantage_epsilon is not None:
            check_choice("scale_rewards (with advantage_epsilon)", str(self.scale_rewards), ("group", "True"))
            check_choice("multi_objective_aggregation", self.multi_objective_aggregation, ("sum_then_normalize",))
        super().__post_init__()


# --- the objective ---------------------------------------------------------------------------------------------------
def grpo_advantages(rewards: torch.Tensor, num_generations: int, epsilon: float) -> torch.Tensor:
    """VERL's GRPO advantage (`compute_grpo_outcome_advantage`, norm_adv_by_std_in_grpo): per group of
    `num_generations` consecutive completions, (r - mean) / (Bessel-corrected std + epsilon). NaN rewards (no reward
    function scored the completion) are left out of their group's statistics and get advantage 0, as TRL does."""
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1, keepdim=True)
    count = (~torch.isnan(grouped)).sum(dim=1, keepdim=True)
    var = torch.nansum((grouped - mean) ** 2, dim=1, keepdim=True) / (count - 1).clamp(min=1)
    advantages = (grouped - mean) / (var.sqrt() + epsilon)
    return torch.nan_to_num(advantages, nan=0.0).view(-1)


def clamped_k3(per_token_logps: torch.Tensor, ref_per_token_logps: torch.Tensor, clamp: float) -> torch.Tensor:
    """VERL's `low_var_kl`: exp(ref - logp) - (ref - logp) - 1, clamped to [-clamp, clamp] (it is >= 0, so only the
    upper bound acts; a clamped token passes no gradient)."""
    log_ratio = ref_per_token_logps - per_token_logps
    return torch.clamp(torch.exp(log_ratio) - log_ratio - 1, min=-clamp, max=clamp)


class InstellaGRPOTrainer(*trainer_mixins(FEATURES), GRPOTrainer):
    """GRPOTrainer with GRPO's training features (`FEATURES`: VERL's AdamW decay on every parameter, the fp32
    reduce, VERL's dynamic micro-batches with `use_dynamic_bsz`), VERL's advantage epsilon and clamped KL (module
    docstring) and, with a vLLM newer than TRL's tested range
    in colocate mode, weight syncs through vLLM's reload (`ReloadingVLLMGeneration`); everything else is TRL's."""

    def __init__(self, *args, advantage_epsilon: float | None = 1e-6, kl_clamp: float | None = 10.0, **kwargs):
        self.advantage_epsilon = advantage_epsilon
        self.kl_clamp = kl_clamp
        self._rewards_per_func = None
        self._policy_logps = None
        super().__init__(*args, **kwargs)
        self.reward_signal = RewardSignal([getattr(f, "dotted_name", f.__name__) for f in self.reward_funcs])
        if self.use_vllm and self.vllm_mode == "colocate" and colocated_sync_needs_reload():
            # TRL builds its VLLMGeneration inside __init__ with no factory to override: the instance takes our
            # subclass, which adds no state and replaces only sync_weights
            self.vllm_generation.__class__ = ReloadingVLLMGeneration
            restore_module_calls(self.model, self.ref_model)

    # private: the only place TRL's rewards are seen before it turns them into advantages [test_private_apis]
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        self._rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        return self._rewards_per_func

    # private: TRL computes the advantages inside it, with its fixed 1e-4 epsilon [test_private_apis]
    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        rewards_per_func, self._rewards_per_func = self._rewards_per_func, None
        weights = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * weights.unsqueeze(0)).nansum(dim=1)
        rewards[torch.isnan(rewards_per_func).all(dim=1)] = torch.nan  # unscorable: TRL's rule
        num_generations = self.num_generations if self.model.training else self.num_generations_eval
        self._log_pass_rates(rewards, num_generations)
        if self.model.training:
            self.reward_signal.observe(rewards_per_func, rewards, num_generations, self.state.global_step)
        if self.advantage_epsilon is None:
            return output
        advantages = grpo_advantages(rewards, num_generations, self.advantage_epsilon)
        local = len(inputs)  # TRL gathered every process's rewards; keep this process's slice, as TRL does
        start = self.accelerator.process_index * local
        output["advantages"] = advantages[start : start + local].to(output["advantages"].dtype)
        return output

    def _log_pass_rates(self, rewards: torch.Tensor, num_generations: int) -> None:
        """With 0/1 rewards (a verified answer): pass@1 = the mean over all samples (as the authors report it) and
        pass@n = the share of prompts with at least one correct sample, logged beside TRL's `reward`."""
        if not torch.isin(rewards, torch.tensor([0.0, 1.0], device=rewards.device)).all():
            return
        mode = "train" if self.model.training else "eval"
        self._metrics[mode]["pass@1"].append(rewards.mean().item())
        grouped = rewards.view(-1, num_generations)
        self._metrics[mode][f"pass@{num_generations}"].append(grouped.amax(dim=1).mean().item())

    # private: the policy log-probs of the loss's forward pass, which the clamped KL term needs [test_private_apis]
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        result = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self._policy_logps = result[0]
        return result

    # private: GRPOTrainer's loss; TRL's KL term is switched off in it and the clamped one added [test_private_apis]
    def _compute_loss(self, model, inputs):
        if self.kl_clamp is None or self.beta == 0.0:
            return super()._compute_loss(model, inputs)
        beta, self.beta = self.beta, 0.0
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self.beta = beta
        per_token_logps, self._policy_logps = self._policy_logps, None
        mask = inputs["completion_mask"]
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        per_token_kl = clamped_k3(per_token_logps, inputs["ref_per_token_logps"], self.kl_clamp)
        kl = (per_token_kl * mask).sum() / mask.sum().clamp(min=1.0)  # token mean, as TRL's bnpo (checked above)
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        totals = self.accelerator.reduce(torch.stack([(per_token_kl * mask).sum(), mask.sum()]).detach(), "sum")
        self._metrics[mode]["kl"].append((totals[0] / totals[1].clamp(min=1.0)).item())
        return loss + beta * kl / normalizer


# --- data ------------------------------------------------------------------------------------------------------------
def load_prompt_sources(specs: list[dict], seed: int, num_proc: int | None = None) -> tuple[Dataset, list[dict]]:
    """Each source's rows (`datasets`: a local file or folder, or a Hub id), sub/up-sampled, concatenated, shuffled."""
    if not specs:
        raise RecipeError("the recipe lists no data `sources`")
    parts, report = [], []
    for index, raw in enumerate(specs):
        source = SourceSpec.from_recipe(index, raw, exclude=PRETRAINING_ONLY | {"converter"})
        dataset = load_rows(source, num_proc=num_proc)
        if source.max_samples is not None and source.max_samples < len(dataset):
            dataset = dataset.shuffle(seed=seed).select(range(source.max_samples))
        if source.repeat not in (None, 1):
            dataset = concatenate_datasets([dataset] * max(1, round(source.repeat)))
        report.append({"path": source.path, "split": source.split, "rows": len(dataset)})
        parts.append(dataset.add_column("_source", [source.name] * len(dataset)))
    try:
        return concatenate_datasets(parts).shuffle(seed=seed), report
    except ValueError as err:
        raise RecipeError(f"the sources do not share their columns: {err}") from None


def check_columns(dataset: Dataset, prompt_column: str, answer_column: str) -> None:
    """Both columns present, else one error naming the source's columns and the recipe field to set."""
    for what, column in (("prompt_column", prompt_column), ("answer_column", answer_column)):
        if column not in dataset.column_names:
            columns = [c for c in dataset.column_names if c != "_source"]
            raise RecipeError(
                f"the GRPO data has no column '{column}' ({what}); its columns are {columns}: set {what} to the "
                f"column with the {'problem text' if what == 'prompt_column' else 'reference answers'} "
                f"(Big-Math/DeepScaleR: problem + answer, DeepMath: question + final_answer)"
            )


def prepare_grpo_dataset(
    dataset: Dataset, tokenizer, args: CheckedGRPOConfig, reward_funcs=()
) -> tuple[Dataset, dict]:
    """Rows -> {prompt: [one user message: problem + " " + suffix], ground_truth: answer}; rows without a problem or an
    answer, rows whose answer one of `reward_funcs` cannot read (`rewards.ground_truth_problem`) and prompts over
    `max_prompt_length` tokens (chat template + generation prompt applied, as VERL's filter counts them) are dropped
    and counted. Returns (dataset, report)."""
    check_columns(dataset, args.prompt_column, args.answer_column)
    suffix = f" {args.prompt_suffix}" if args.prompt_suffix else ""
    rows, counts, unreadable = [], Counter(), None
    for row in dataset:
        problem, answer = row[args.prompt_column], row[args.answer_column]
        if not isinstance(problem, str) or not problem.strip():
            counts["no problem text"] += 1
            continue
        if answer is None or str(answer).strip() == "":
            counts["no reference answer"] += 1
            continue
        problem_with_answer = ground_truth_problem(reward_funcs, answer)
        if problem_with_answer is not None:
            counts["reference answer the reward cannot read"] += 1
            where = f" in {row['_source']}" if "_source" in row else ""
            unreadable = unreadable or f"{args.answer_column}{where}: {problem_with_answer}"
            continue
        prompt = [{"role": "user", "content": problem + suffix}]
        if args.max_prompt_length is not None:
            ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)
            if len(ids["input_ids"]) > args.max_prompt_length:
                counts[f"prompt over {args.max_prompt_length} tokens"] += 1
                continue
        rows.append({"prompt": prompt, GROUND_TRUTH: str(answer)})
    report = {"rows": len(dataset), "kept": len(rows), "skipped": dict(sorted(counts.items()))}
    report["summary"] = f"[grpo data] {len(dataset)} prompts: kept {len(rows)}; skipped: " + (
        ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
    )
    if unreadable:
        report["first_unreadable_answer"] = unreadable
    if not rows or sum(counts.values()) > args.max_skip_fraction * len(dataset):
        raise RecipeError(
            f"{report['summary']}. More than max_skip_fraction={args.max_skip_fraction} of the prompts are unusable: "
            f"check prompt_column / answer_column and max_prompt_length"
            + (f" (first unreadable answer: {unreadable})" if unreadable else "")
        )
    if unreadable:
        logger.warning(f"[grpo data] dropped the prompts whose answer the reward cannot read; the first: {unreadable}")
    if args.max_samples is not None:
        rows = rows[: args.max_samples]
    return Dataset.from_list(rows), report


# --- the run ---------------------------------------------------------------------------------------------------------
def check_lengths(args: CheckedGRPOConfig, model_args) -> None:
    """A rollout can never exceed what the model (or the vLLM engine) holds: prompt cap + completion cap must fit."""
    need = (args.max_prompt_length or 0) + (args.max_completion_length or 0)
    config = AutoConfig.from_pretrained(model_args.model_name_or_path, trust_remote_code=True)
    if args.max_prompt_length is not None:
        what = f"max_prompt_length {args.max_prompt_length} + max_completion_length {args.max_completion_length}"
        check_fits_positions(config, need, what, "lower max_completion_length")
    if args.use_vllm and args.vllm_max_model_length is not None and need > args.vllm_max_model_length:
        raise RecipeError(
            f"vllm_max_model_length {args.vllm_max_model_length} < max_prompt_length + max_completion_length "
            f"({need}): raise vllm_max_model_length or leave it null"
        )


def check_sampling(args: CheckedGRPOConfig) -> None:
    """GRPO's own numbers, each in its range before TRL sees it (TRL divides by some of them: a 0 is a traceback
    there, or a run that samples nothing)."""
    check_range("num_generations", args.num_generations, 2, integer=True, hint="GRPO compares a group of completions")
    check_range("num_generations_eval", args.num_generations_eval, 1, integer=True, allow_none=True)
    check_range("temperature", args.temperature, 0, low_open=True, hint="GRPO samples its rollouts; the authors' 1.0")
    check_range("top_p", args.top_p, 0, 1, low_open=True)
    check_range("top_k", args.top_k, 0, integer=True, allow_none=True, hint="0 turns top-k off")
    check_range("min_p", args.min_p, 0, 1, allow_none=True)
    check_range("repetition_penalty", args.repetition_penalty, 0, low_open=True)
    check_range("max_completion_length", args.max_completion_length, 1, integer=True)
    check_range("num_iterations", args.num_iterations, 1, integer=True)
    check_range("steps_per_generation", args.steps_per_generation, 1, integer=True, allow_none=True)
    check_range("generation_batch_size", args.generation_batch_size, 1, integer=True, allow_none=True)
    check_range("epsilon", args.epsilon, 0, low_open=True, hint="the PPO clip range; the authors' 0.2")
    check_range("epsilon_high", args.epsilon_high, 0, low_open=True, allow_none=True)
    check_range("delta", args.delta, 1, low_open=True, allow_none=True, hint="the dual-clip cap; the authors' 3.0")


class GRPOStage(Stage):
    """GRPO in the training lifecycle (`trainer/stage.py`): input model and reward functions checked before any work,
    the prompts formatted and filtered (rank 0 first), the model, `InstellaGRPOTrainer`; beside the model the data
    report."""

    name = "grpo"
    features = FEATURES
    settings_class = CheckedGRPOConfig
    trainer_class = InstellaGRPOTrainer

    def check(self) -> None:
        check_model_path(self.model_args)
        if self.model_args.use_peft:
            raise RecipeError("use_peft is not supported by the GRPO stage yet (the authors train all weights)")
        check_lengths(self.args, self.model_args)
        self.reward_funcs = load_reward_funcs(self.args.reward_funcs)
        default = (
            " (the default; set reward_funcs to choose others)" if self.args.reward_funcs == [DEFAULT_REWARD] else ""
        )
        logger.info(f"[grpo] reward functions: {', '.join(self.args.reward_funcs)}{default}")

    def load_data(self) -> PostTrainingData:
        args = self.args
        tokenizer = load_tokenizer_with_template(args, self.model_args)
        self.stop_point("after loading the tokenizer")
        with PartialState().main_process_first():
            rows, sources = load_prompt_sources(args.sources, args.seed)
            train, report = prepare_grpo_dataset(rows, tokenizer, args, self.reward_funcs)
        logger.info(report["summary"])
        return PostTrainingData(tokenizer, train, {"sources": sources, **report})

    def build_model(self, data: PostTrainingData):
        model = load_model(self.model_args)
        check_launch(self.args, model, data.tokenizer)
        return model

    def build_trainer(self, data: PostTrainingData, model, callbacks: list):
        return InstellaGRPOTrainer(
            model=model,
            reward_funcs=self.reward_funcs,
            args=self.args,
            train_dataset=data.dataset,
            processing_class=data.tokenizer,
            callbacks=callbacks or None,
            advantage_epsilon=self.args.advantage_epsilon,
            kl_clamp=self.args.kl_clamp,
            **self.feature_kwargs(data, model),
        )

    def after_train(self, trainer) -> None:
        """A run in which no step had a learning signal fails here, before the final save (`grpo_signal.py`)."""
        if self.preemption is not None and self.preemption.preempted:
            return
        message = trainer.reward_signal.no_signal_error(trainer.state.log_history)
        if message is not None and not self.args.allow_no_signal:
            raise RecipeError(message)
        if message is not None:
            logger.warning(f"{message.split('. Check')[0]} (allow_no_signal: true, finishing)")

    def save_extras(self, trainer, data: PostTrainingData) -> None:
        if trainer.is_world_process_zero():
            (self.output_dir / "data_report.json").write_text(json.dumps(data.report, indent=2) + "\n")
            logger.info(data.report["summary"])

    def manifest_fields(self, trainer, data: PostTrainingData) -> dict:
        return {
            "inputs": {
                "model": self.model_args.model_name_or_path,
                "model_manifest": read_manifest_safe(self.model_args),
            },
            "data": data.report,
        }


def build_trainer(training_args, model_args, callbacks=()):
    """Everything up to a ready trainer (data checked first), for tests and tools: (trainer, data)."""
    return GRPOStage(training_args, model_args).build(callbacks)


def server_failure(err: Exception, args: CheckedGRPOConfig) -> str | None:
    """A vLLM server that stopped answering mid-run, as one line (None for any other error)."""
    names = {type(e).__name__ for e in (err, err.__cause__, err.__context__) if e is not None}
    if not args.use_vllm or args.vllm_mode != "server" or not names & {"ConnectionError", "ReadTimeout", "Timeout"}:
        return None
    where = args.vllm_server_base_url or f"{args.vllm_server_host}:{args.vllm_server_port}"
    return (
        f"the vLLM server at {where} stopped answering during training ({type(err).__name__}); nothing was saved "
        f"as complete: restart it (trl vllm-serve ...) and rerun, training resumes from the last checkpoint"
    )


def engine_failure(err: Exception, args: CheckedGRPOConfig) -> str | None:
    """The colocated vLLM engine raising mid-run (the innermost frame of the error, or of its cause, lies in vLLM's
    package), as one line (None for any other error)."""
    if not args.use_vllm or args.vllm_mode != "colocate":
        return None
    for error in (err, err.__cause__, err.__context__):
        frames = traceback.extract_tb(error.__traceback__) if error is not None else []
        if frames and f"{os.sep}vllm{os.sep}" in frames[-1].filename:
            what = (str(error).strip().splitlines() or [""])[0][:300]
            return (
                f"the colocated vLLM engine failed during training ({type(error).__name__}: {what}); nothing was "
                f"saved as complete: fix the cause and rerun, training resumes from the last checkpoint"
            )
    return None


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/grpo.py`: parse the recipe and the command line, then one whole GRPO run (exit code 0)."""
    args, model_args = parse_recipe([CheckedGRPOConfig, CheckedModelConfig], argv)
    setup_logging()
    try:
        return run_stage(GRPOStage(args, model_args, argv))
    except Exception as err:
        message = server_failure(err, args) or engine_failure(err, args)
        if message is None:
            raise
        raise RecipeError(message) from err
