"""The reward functions GRPO calls (`instella_recipes.rewards`): the recipe's dotted paths loaded and checked, a
failing or misbehaving reward function as one clear line, and the numeric final-answer check of the tiny demo."""

import pytest

from instella_recipes.core import RecipeError
from instella_recipes.rewards import RewardFunctionError, checked_reward, final_answer_reward, load_reward_funcs
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
