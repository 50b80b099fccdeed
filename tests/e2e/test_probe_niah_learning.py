"""benchmarks/probe_niah_learning.py, the learnability probe docs/instella_long.md quotes, cannot rot: both tasks run
a few steps on a demo-shaped run folder (TinyWorld data, the demo's kind of tokenizer, a tiny reconfigured model) and
print their retrieval table at every evaluation size."""

import ast
import sys

import pytest

from benchmarks import probe_niah_learning as probe
from instella_recipes.data.tiny_world import TinyWorld, write_tiny_world
from instella_recipes.data.tokenizer import train_bpe_tokenizer
from modeling_instella import InstellaConfig, InstellaForCausalLM


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("demo")
    write_tiny_world(run / "data", TinyWorld(n_train_problems=8, n_eval_problems=4))
    train_bpe_tokenizer([r["text"] for r in TinyWorld().corpus()], vocab_size=512).save_pretrained(run / "tokenizer")
    config = InstellaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                            rope_theta=514640.0)  # fmt: skip
    InstellaForCausalLM(config).save_pretrained(run / "long_start")
    return run


def _tables(out: str) -> list[dict]:
    return [ast.literal_eval(line[line.index("{") :]) for line in out.splitlines() if line.startswith("step ")]


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize(
    ("task_args", "sizes"),
    [
        (
            [
                "--task",
                "needle",
                "--loss",
                "answer",
                "--chars",
                "20,100",
                "--long_every",
                "2",
                "--long_chars",
                "300,600",
                "--eval_chars",
                "200,600",
                "--n_eval",
                "5",
            ],
            2,
        ),  # fmt: skip
        (["--task", "digit", "--n_eval", "4"], 3),
    ],
)
def test_the_probe_trains_and_scores_every_size(run_dir, task_args, sizes, monkeypatch, capsys):
    argv = ["probe", "--run", str(run_dir), "--steps", "2", "--batch", "2", "--eval_every", "1", "--threads", "1"]
    monkeypatch.setattr(sys, "argv", argv + task_args)
    probe.main()
    tables = _tables(capsys.readouterr().out)
    assert len(tables) == 3  # step 0, 1, 2
    for table in tables:
        assert len(table) == sizes
        assert all(0.0 <= whole <= first <= 1.0 for whole, first in table.values())
