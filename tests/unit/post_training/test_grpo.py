"""The GRPO stage: the published recipes hold the published numbers (INSTELLA_LONG_MATH.md 2.3, [BLOG-M] and
run_grpo_multi_nodes.sh), the authors' prompt format and overlong-prompt filter, and one clear line for each kind of
bad input (answer column missing, a reward function that raises, a rollout cap the model cannot hold, a vLLM server
that stops answering, a colocated vLLM engine that raises)."""

import copy
import re
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from instella_recipes.core import RecipeError, parse_recipe
from instella_recipes.post_training.grpo import (
    PROMPT_SUFFIX,
    CheckedGRPOConfig,
    check_lengths,
    engine_failure,
    prepare_grpo_dataset,
    server_failure,
)
from instella_recipes.post_training.grpo_signal import RewardSignal, has_signal
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.rewards import load_reward_funcs

ROOT = Path(__file__).resolve().parents[3]
MATH = ROOT / "recipes" / "instella-3b-math"
# [BLOG-M] per-stage table: data, rollouts, max output tokens, GRPO steps, GPUs; columns from the authors'
# verl/examples/data_preprocess/{big_math,deep_math,deepscaler}.py.
PUBLISHED = {
    1: ("SynthLabsAI/Big-Math-RL-Verified", "problem", "answer", 8, 8192, 1200, 16),
    2: ("zwhe99/DeepMath-103K", "question", "final_answer", 16, 16000, 600, 32),
    3: ("agentica-org/DeepScaleR-Preview-Dataset", "problem", "answer", 16, 16000, 740, 32),
}


def parse(path: Path, *extra: str):
    # bf16 is the published setting; this CPU machine cannot validate it, so the test overrides it
    return parse_recipe([CheckedGRPOConfig, CheckedModelConfig], ["--config", str(path), "--bf16", "false", *extra])


@pytest.mark.parametrize("stage", sorted(PUBLISHED))
def test_published_recipes_hold_the_published_numbers(stage):
    data, prompt_column, answer_column, rollouts, max_tokens, grpo_steps, gpus = PUBLISHED[stage]
    path = MATH / f"grpo_stage{stage}.yaml"
    args, model_args = parse(path)
    assert re.match(rf"# \d nodes x 8 MI300X \({gpus} GPUs\)", path.read_text())
    assert args.sources == [{"path": data, "split": "train"}]
    assert (args.prompt_column, args.answer_column) == (prompt_column, answer_column)
    assert (
        args.prompt_suffix == PROMPT_SUFFIX == "Let's think step by step and output the final answer within \\boxed{}."
    )
    assert args.max_prompt_length == 512
    assert (args.num_generations, args.max_completion_length) == (rollouts, max_tokens)
    # 128 prompts per GRPO step, in 4 mini-batches of 32 prompts, one optimizer update each
    assert args.generation_batch_size == 128 * rollouts
    assert args.global_batch_size == 32 * rollouts
    assert args.per_device_train_batch_size * args.gradient_accumulation_steps * gpus == args.global_batch_size
    assert args.max_steps == grpo_steps * (args.generation_batch_size // args.global_batch_size) == grpo_steps * 4
    assert args.num_iterations == 1
    # VERL's dynamic micro-batches (stages 2-3: run_grpo_multi_nodes.sh L126-127; stage 1: the same, inferred)
    assert (args.use_dynamic_bsz, args.ppo_max_token_len_per_gpu) == (True, 17000)
    # optimizer: constant 1e-6, AdamW (0.9, 0.999), wd 0.01, clip 1.0
    assert (args.learning_rate, args.lr_scheduler_type.value, args.warmup_steps) == (1e-6, "constant", 0)
    assert (args.weight_decay, args.adam_beta1, args.adam_beta2, args.max_grad_norm) == (0.01, 0.9, 0.999, 1.0)
    # the objective: clip 0.2/0.2, dual clip 3, token mean, k3 KL 0.001 clamped at 10, GRPO advantages eps 1e-6
    assert (args.epsilon, args.epsilon_high, args.delta, args.loss_type) == (0.2, 0.2, 3.0, "bnpo")
    assert (args.beta, args.kl_clamp, args.use_bias_correction_kl) == (0.001, 10.0, False)
    assert (args.scale_rewards, args.advantage_epsilon) == ("group", 1e-6)
    assert (args.temperature, args.top_p, args.top_k) == (1.0, 1.0, 0)
    assert (args.use_vllm, args.vllm_mode, args.vllm_importance_sampling_correction) == (True, "colocate", False)
    assert args.vllm_tensor_parallel_size == 1
    assert args.reward_funcs == ["instella_recipes.rewards.reward"]


def test_stages_chain_and_tiny_recipe_parses():
    inputs = [parse(MATH / f"grpo_stage{n}.yaml")[1].model_name_or_path for n in (1, 2, 3)]
    assert inputs == [
        "amd/Instella-3B-Math-SFT",
        "runs/instella-3b-math/grpo_stage1",
        "runs/instella-3b-math/grpo_stage2",
    ]
    args, _ = parse(ROOT / "recipes" / "tiny" / "grpo.yaml")
    assert args.reward_funcs == ["instella_recipes.rewards.final_answer_reward"]


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer):
    return install_chat_template(copy.deepcopy(tiny_tokenizer))


def grpo_args(tmp_path, **overrides) -> CheckedGRPOConfig:
    settings = dict(
        output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", num_generations=2,
        per_device_train_batch_size=2, beta=0.001, use_bias_correction_kl=False, loss_type="bnpo",
    )  # fmt: skip
    return CheckedGRPOConfig(**{**settings, **overrides})


def test_prompt_format_and_overlong_prompts_dropped_and_counted(tmp_path, tokenizer):
    rows = Dataset.from_list(
        [
            {"problem": "What is 1 + 1?", "answer": "2"},
            {"problem": "word " * 600, "answer": "3"},  # over 512 tokens with the chat template
            {"problem": "What is 2 + 2?", "answer": "4"},
            {"problem": "What is 3 + 3?", "answer": None},
        ]
    )
    data, report = prepare_grpo_dataset(rows, tokenizer, grpo_args(tmp_path))
    assert data[0] == {
        "prompt": [{"role": "user", "content": "What is 1 + 1? " + PROMPT_SUFFIX}],
        "ground_truth": "2",
    }
    assert data["ground_truth"] == ["2", "4"]
    assert report["skipped"] == {"no reference answer": 1, "prompt over 512 tokens": 1}
    assert "4 prompts: kept 2" in report["summary"]
    # the limit counts the templated prompt with its generation prompt, as VERL's filter does
    text = tokenizer.apply_chat_template(data[0]["prompt"], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|assistant|>\n") and PROMPT_SUFFIX in text


def test_missing_answer_column_is_one_error_naming_the_field(tmp_path, tokenizer):
    rows = Dataset.from_list([{"question": "What is 1 + 1?", "final_answer": "2"}])
    with pytest.raises(RecipeError, match=r"no column 'problem' \(prompt_column\).*\['question', 'final_answer'\]"):
        prepare_grpo_dataset(rows, tokenizer, grpo_args(tmp_path))
    with pytest.raises(RecipeError, match=r"no column 'answer' \(answer_column\).*set answer_column"):
        prepare_grpo_dataset(rows, tokenizer, grpo_args(tmp_path, prompt_column="question"))
    data, _ = prepare_grpo_dataset(
        rows, tokenizer, grpo_args(tmp_path, prompt_column="question", answer_column="final_answer")
    )
    assert data["ground_truth"] == ["2"]


def test_answers_the_reward_cannot_read_are_dropped_counted_or_refused(tmp_path, tokenizer):
    (reward,) = load_reward_funcs(["instella_recipes.rewards.final_answer_reward"])
    gsm8k = [{"problem": f"What is {n} + 1?", "answer": f"{n} + 1 = {n + 1}.\n#### {n + 1}"} for n in range(3)]
    data, report = prepare_grpo_dataset(
        Dataset.from_list([*gsm8k, {"problem": "Name it.", "answer": "five"}]),
        tokenizer,
        grpo_args(tmp_path),
        [reward],
    )
    assert len(data) == 3 and report["skipped"] == {"reference answer the reward cannot read": 1}
    assert "'five' (not a number, nor a GSM8K answer" in report["first_unreadable_answer"]
    words = Dataset.from_list([{"problem": "Name it.", "answer": "five"}] * 3)
    with pytest.raises(RecipeError) as err:
        prepare_grpo_dataset(words, tokenizer, grpo_args(tmp_path), [reward])
    assert "\n" not in str(
        err.value
    ) and "first unreadable answer: answer: final_answer_reward cannot read 'five'" in str(err.value)


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("temperature", "0", "temperature must be > 0, got 0.0"),
        ("num_generations", "0", "num_generations must be >= 2, got 0"),
        ("top_p", "0", "top_p must be in (0, 1], got 0.0"),
        ("top_k", "-1", "top_k must be >= 0, got -1"),
        ("max_completion_length", "0", "max_completion_length must be >= 1, got 0"),
        ("num_iterations", "0", "num_iterations must be >= 1, got 0"),
        ("steps_per_generation", "0", "steps_per_generation must be >= 1, got 0"),
        ("epsilon", "-0.2", "epsilon must be > 0, got -0.2"),
        ("delta", "0.5", "delta must be > 1, got 0.5"),
        ("beta", "-0.1", "beta must be >= 0, got -0.1 (the KL coefficient; 0 turns the KL term off)"),
    ],
)
def test_bad_grpo_numbers_are_one_line(flag, value, says):
    with pytest.raises(RecipeError) as err:
        parse(ROOT / "recipes" / "tiny" / "grpo.yaml", f"--{flag}", value)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_grpo_beta_0_turns_the_kl_off_and_is_accepted():
    args, _ = parse(ROOT / "recipes" / "tiny" / "grpo.yaml", "--beta", "0")
    assert args.beta == 0.0


def test_reward_signal_tracks_groups_without_a_spread(caplog):
    signal = RewardSignal(["r"], warn_after=2)
    same = torch.tensor([1.0, 1.0, 0.0, 0.0])  # two groups of 2, each all-equal: no signal
    assert not has_signal(same, 2) and has_signal(torch.tensor([1.0, 0.0, 0.0, 0.0]), 2)
    assert not has_signal(torch.tensor([float("nan"), 1.0, 0.0, 0.0]), 2)  # one finite reward is no spread
    with caplog.at_level("WARNING"):
        for step in range(3):
            signal.observe(same.view(-1, 1), same, 2, step)
    assert [r.getMessage() for r in caplog.records if "no learning signal for 2 rollout batches" in r.getMessage()]
    message = signal.no_signal_error([])
    assert message.startswith("GRPO learned nothing") and "reward functions: r (values 0..1)" in message
    # the logged history decides across a resume: one logged step with a spread is a signal
    assert signal.no_signal_error([{"frac_reward_zero_std": 1.0}, {"frac_reward_zero_std": 0.5}]) is None
    assert signal.no_signal_error([{"frac_reward_zero_std": 1.0}]) is not None
    signal.observe(torch.tensor([[1.0], [0.0]]), torch.tensor([1.0, 0.0]), 2, 3)
    assert signal.no_signal_error([]) is None


def test_rollout_cap_the_model_cannot_hold_is_refused(tmp_path, tiny_model_dir):
    class Model:
        model_name_or_path = str(tiny_model_dir)  # max_position_embeddings 256

    check_lengths(grpo_args(tmp_path, max_prompt_length=64, max_completion_length=192), Model)
    with pytest.raises(RecipeError, match=r"64 \+ max_completion_length 256 = 320 tokens exceed .* 256"):
        check_lengths(grpo_args(tmp_path, max_prompt_length=64, max_completion_length=256), Model)


def test_vllm_server_that_stops_answering_is_one_line(tmp_path):
    import requests

    args = grpo_args(tmp_path, use_vllm=True, vllm_mode="server", vllm_server_port=8123)
    message = server_failure(requests.exceptions.ConnectionError("Connection refused"), args)
    assert message.startswith("the vLLM server at 0.0.0.0:8123 stopped answering") and "resumes" in message
    assert server_failure(ValueError("other"), args) is None


def test_colocated_vllm_engine_that_raises_is_one_line(tmp_path):
    args = grpo_args(tmp_path, use_vllm=True, vllm_mode="colocate")
    in_vllm = compile("raise RuntimeError('EngineCore died\\nmore')", "/v/vllm/v1/engine/core.py", "exec")
    with pytest.raises(RuntimeError) as raised:
        exec(in_vllm)
    message = engine_failure(raised.value, args)
    assert message.startswith("the colocated vLLM engine failed during training (RuntimeError: EngineCore died)")
    assert "resumes from the last checkpoint" in message and "more" not in message
    assert engine_failure(ValueError("ours"), args) is None  # raised outside vLLM: the traceback stays
    assert engine_failure(raised.value, grpo_args(tmp_path)) is None  # no vLLM in the run


def test_objective_settings_that_cannot_combine_are_refused(tmp_path):
    with pytest.raises(RecipeError, match="set use_bias_correction_kl: false"):
        grpo_args(tmp_path, use_bias_correction_kl=True)
    with pytest.raises(RecipeError, match="loss_type 'dapo'"):
        grpo_args(tmp_path, loss_type="dapo")
    assert grpo_args(tmp_path, loss_type="dapo", kl_clamp=None).kl_clamp is None


def test_pipeline_chains_instruct_sft_grpo_eval_and_releases_under_the_hub_names():
    from instella_recipes.pipeline.graph import load_pipeline

    pipeline = load_pipeline(MATH / "pipeline.yaml")
    stages = {s.name: s for s in pipeline.stages}
    chain = ["sft_stage1", "sft_stage2", "grpo_stage1", "grpo_stage2", "grpo_stage3"]
    assert [s for s in stages if s in chain] == chain

    def model_of(name):
        args = stages[name].resolved.args
        return args[args.index("--model_name_or_path") + 1]

    assert model_of("sft_stage1") == "amd/Instella-3B-Instruct"
    for before, after in zip(chain, chain[1:]):
        assert stages[after].inputs == [before]
        assert model_of(after) == str(pipeline.output_of(stages[before]))
    assert stages["eval_grpo"].inputs == ["grpo_stage3"] and stages["eval_sft"].inputs == ["sft_stage2"]
    assert pipeline.output_of(stages["release_sft"]).name == "Instella-3B-Math-SFT"
    assert pipeline.output_of(stages["release"]).name == "Instella-3B-Math"


def test_report_shows_reward_and_pass_rates_per_step(tmp_path):
    import json

    from instella_recipes.pipeline.report import grpo_section

    out = tmp_path / "grpo"
    out.mkdir()
    history = [
        {"step": s, "reward": r, "pass@1": r, "pass@4": p, "loss": 0.0} for s, r, p in [(1, 0.25, 0.5), (2, 0.5, 1.0)]
    ]
    (out / "trainer_state.json").write_text(json.dumps({"log_history": history, "global_step": 2}))
    lines = grpo_section([{"stage": "grpo", "output": str(out)}], tmp_path, Path("report"))
    assert "| step | reward | pass@1 | pass@4 |" in lines
    assert "| 1 | 0.250 | 0.250 | 0.500 |" in lines and "| 2 | 0.500 | 0.500 | 1.000 |" in lines
    assert (tmp_path / "grpo_grpo.png").is_file()


def test_run_without_a_signal_fails_unless_allowed_or_preempted(tmp_path):
    from types import SimpleNamespace

    from instella_recipes.post_training.grpo import GRPOStage

    signal = RewardSignal(["my.reward"])
    signal.observe(torch.zeros(4, 1), torch.zeros(4), 2, 1)
    trainer = SimpleNamespace(reward_signal=signal, state=SimpleNamespace(log_history=[{"frac_reward_zero_std": 1.0}]))
    stage = GRPOStage(grpo_args(tmp_path), None)
    with pytest.raises(RecipeError, match=r"GRPO learned nothing: .*my.reward \(values 0..0\)"):
        stage.after_train(trainer)
    stage.preemption = SimpleNamespace(preempted=True)  # stopped early: the rerun resumes, nothing is judged yet
    stage.after_train(trainer)
    stage.preemption = None
    GRPOStage(grpo_args(tmp_path, allow_no_signal=True), None).after_train(trainer)  # a warning, not an error
