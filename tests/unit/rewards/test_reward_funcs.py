"""The reward functions GRPO calls (`instella_recipes.rewards`): the recipe's dotted paths loaded and checked, a
failing or misbehaving reward function as one clear line, and the numeric final-answer check of the tiny demo."""

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.rewards import (
    RewardFunctionError,
    checked_reward,
    final_answer_reward,
    ground_truth_problem,
    load_reward_funcs,
)
from tests.helpers import grpo_rewards


def test_reward_function_that_raises_is_one_clear_line():
    reward = checked_reward(grpo_rewards.raises, "tests.helpers.grpo_rewards.raises")
    completions = [[{"role": "assistant", "content": "The answer is 2."}]]
    with pytest.raises(RewardFunctionError) as err:
        reward(completions, ["2"])
    message = str(err.value)
    assert "\n" not in message
    assert "reward function tests.helpers.grpo_rewards.raises raised ZeroDivisionError: division by zero" in message
    assert "resumes from the last checkpoint" in message
    wrong_count = checked_reward(lambda c, g, **k: [1.0], "short")
    with pytest.raises(RewardFunctionError, match="returned 1 values for 2 completions"):
        wrong_count(["a", "b"], ["1", "2"])
    with pytest.raises(RecipeError, match="cannot import 'no_such_module.reward'"):
        load_reward_funcs(["no_such_module.reward"])


def test_final_answer_reward():
    completions = ["3 + 4 = 7. The answer is 7.", "so \\boxed{1,234}", "The answer is 8.", "no answer", "answer is 7"]
    assert final_answer_reward(completions, ["7", "1234", "7", "7", "7.0"]) == [1.0, 1.0, 0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    ("function", "bad"),
    [
        (grpo_rewards.returns_nan, "returned nan for completion 1 of 2"),
        (lambda c, g, **k: [1.0, None], "returned None for completion 1 of 2"),
        (lambda c, g, **k: [float("inf"), 1.0], "returned inf for completion 0 of 2"),
        (lambda c, g, **k: ["1.0", 1.0], "returned '1.0' (str, not a number) for completion 0 of 2"),
        (grpo_rewards.returns_generator, "returned a generator, not a list of numbers"),
        (lambda c, g, **k: 1.0, "returned a float, not a list of numbers"),
        (lambda c, g, **k: [1.0, 0.0, 1.0], "returned 3 values for 2 completions"),
    ],
)
def test_reward_output_that_is_not_one_finite_float_per_completion_is_one_line(function, bad):
    reward = checked_reward(function, "my.reward")
    with pytest.raises(RewardFunctionError) as err:
        reward(["a", "b"], ["1", "2"])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"reward function my.reward {bad}"), message
    assert "list of 2 finite floats, one per completion" in message


def test_reward_output_as_numbers_of_any_kind_is_accepted():
    import numpy as np
    import torch

    for values in ([1, 0.5], (True, 0.0), np.array([1.0, 0.0]), torch.tensor([1.0, 0.0]), [np.float32(1.0), 0]):
        assert checked_reward(lambda c, g, v=values, **k: v, "ok")(["a", "b"], ["1", "2"])[0] == 1.0


def test_reward_funcs_naming_what_is_not_a_function_is_one_line():
    with pytest.raises(RecipeError, match=r"grpo_rewards.NOT_A_FUNCTION is a float \(0.5\), not a function"):
        load_reward_funcs(["tests.helpers.grpo_rewards.NOT_A_FUNCTION"])
    with pytest.raises(RecipeError, match=r"reward_funcs: 1.5 is not a dotted path"):
        load_reward_funcs([1.5])
    with pytest.raises(RecipeError, match=r"must take \(completions, ground_truth, \*\*kwargs\)"):
        load_reward_funcs(["os.getcwd"])


def test_final_answer_reward_reads_gsm8k_answers():
    assert final_answer_reward(["The answer is 5."], ["4 + 1 = 5.\n#### 5"]) == [1.0]
    completions = ["So 12 in all.\n#### 12", "The answer is 1,234.", "#### 13", "The answer is 5."]
    truths = ["6 * 2 = <<6*2=12>>12\n#### 12", "#### 1234", "#### 12", "five"]
    assert final_answer_reward(completions, truths) == [1.0, 1.0, 0.0, 0.0]


def test_reference_answers_the_reward_cannot_read_are_named():
    (reward,) = load_reward_funcs(["instella_recipes.rewards.final_answer_reward"])
    assert ground_truth_problem([reward], "4 + 1 = 5.\n#### 5") is None
    assert ground_truth_problem([reward], "-3.5") is None
    assert ground_truth_problem([reward], "five") == (
        "final_answer_reward cannot read 'five' (not a number, nor a GSM8K answer ending '#### <number>')"
    )
    (grader,) = load_reward_funcs(["instella_recipes.rewards.reward"])  # the Prime-RL grader reads a final answer
    assert ground_truth_problem([grader], "\\frac{1}{2}") is None
    assert "a GSM8K worked answer" in ground_truth_problem([grader], "4 + 1 = 5.\n#### 5")
