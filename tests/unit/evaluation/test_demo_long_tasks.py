"""The demo's long-context lm-eval tasks (eval/tasks/demo/tiny_niah_4k.yaml, tiny_long_ppl_4k.yaml) load offline with
lm-eval's TaskManager, hold the items the TinyWorld generator makes, fit the tiny model's 4,096 positions with the
demo tokenizer, and score as intended (exact retrieval of the code; bits per byte of the whole text)."""

import re
from pathlib import Path

import pytest
from lm_eval.tasks import TaskManager, get_task_dict

from instella_recipes.data.tiny_world import NEEDLE_ANSWER, TinyWorld, niah_single_items

TASKS = Path(__file__).resolve().parents[3] / "eval" / "tasks" / "demo"


@pytest.fixture(scope="module")
def tasks():
    manager = TaskManager(include_path=str(TASKS), include_defaults=False)
    return get_task_dict(["tiny_niah_4k", "tiny_long_ppl_4k"], manager)


def test_niah_items_are_the_generators_and_fit_4k_positions(tasks, tiny_tokenizer):
    task = tasks["tiny_niah_4k"]
    docs = list(task.test_docs())
    assert docs == niah_single_items(TinyWorld(seed=1234), per_depth=4, n_chars=13500)
    assert sorted({d["depth"] for d in docs}) == [0.1, 0.3, 0.5, 0.7, 0.9] and len(docs) == 20
    for doc in docs:
        prompt, target = task.doc_to_text(doc), task.doc_to_target(doc)
        # the chat layout the long SFT trains, the answer's fixed opening last
        assert prompt.startswith("<|endoftext|><|user|>\n" + doc["context"] + "\n<|assistant|>\n")
        assert prompt.endswith(f"?\n<|assistant|>\n{NEEDLE_ANSWER}") and target == doc["target"]
        assert target[0] == " " and target[1:].isdigit() and len(target) == 3
        assert re.findall(r"\d+", prompt) == [target[1:]]  # the code is the only number in the context
        length = len(tiny_tokenizer(prompt + target)["input_ids"])
        assert 3000 < length <= 4096, length  # a 4K test, inside the reconfigured model's positions
    # exact retrieval: lm-eval's `acc` of a log-likelihood task is whether the target is the greedy continuation
    assert task.process_results(docs[0], [(-0.5, True)]) == {"acc": 1.0}
    assert task.process_results(docs[0], [(-0.5, False)]) == {"acc": 0.0}


def test_long_ppl_scores_the_whole_4k_text(tasks):
    task = tasks["tiny_long_ppl_4k"]
    docs = list(task.test_docs())
    assert [d["depth"] for d in docs] == [0.1, 0.3, 0.5, 0.7, 0.9]
    assert task.doc_to_target(docs[0]) == docs[0]["context"]
    scored = task.process_results(docs[0], [-1000.0])
    assert scored["bits_per_byte"] == (-1000.0, len(docs[0]["context"].encode()))
