"""Answer generation for the LLM-judged benchmarks writes exactly the judges' input formats (no judge is faked)."""

import json
import shutil

import pytest

from instella_recipes.evaluation import judge_inputs

TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_alpaca_eval_and_mt_bench_files(tiny_model_dir, tiny_tokenizer, tmp_path):
    model_dir = tmp_path / "chat"
    shutil.copytree(tiny_model_dir, model_dir)
    tok = tiny_tokenizer.__class__.from_pretrained(model_dir)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(model_dir)
    alpaca = tmp_path / "alpaca_eval.json"
    alpaca.write_text(json.dumps([{"instruction": "Name a river.", "dataset": "helpful_base"}]))
    mt = tmp_path / "question.jsonl"
    mt.write_text(json.dumps({"question_id": 81, "category": "writing", "turns": ["Write.", "Shorter."]}) + "\n")
    out = tmp_path / "out"
    args = ["--model", str(model_dir), "--model_id", "tiny", "--output_dir", str(out), "--max_new_tokens", "4"]
    assert judge_inputs.main([*args, "--alpaca_eval", str(alpaca), "--mt_bench", str(mt)]) == 0

    (row,) = json.loads((out / "alpaca_eval" / "tiny.json").read_text())
    assert row["instruction"] == "Name a river." and row["generator"] == "tiny" and row["dataset"] == "helpful_base"
    assert isinstance(row["output"], str)
    (answer,) = [json.loads(x) for x in (out / "mt_bench" / "model_answer" / "tiny.jsonl").read_text().splitlines()]
    assert answer["question_id"] == 81 and answer["model_id"] == "tiny"
    assert len(answer["choices"][0]["turns"]) == 2  # both turns answered, turn 2 after turn 1's reply
    assert not list(out.rglob("*.partial"))


def test_bad_inputs(tiny_model_dir, tmp_path):
    bad = tmp_path / "alpaca.json"
    bad.write_text(json.dumps({"not": "a list"}))
    base = ["--model", str(tiny_model_dir), "--model_id", "x", "--output_dir", str(tmp_path / "o")]
    assert _exit_code([*base, "--alpaca_eval", str(bad)]) == 2
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps([{"instruction": "hi"}]))
    assert _exit_code([*base, "--alpaca_eval", str(ok)]) == 2  # no chat template: not a chat model
    assert _exit_code(base) == 2
    assert not (tmp_path / "o").exists()


def _exit_code(argv) -> int:
    with pytest.raises(SystemExit) as exit_info:
        judge_inputs.main(argv)
    return exit_info.value.code


def test_mt_bench_turns_follow_the_authors_fastchat_instella_conversation(monkeypatch):
    """Turn 2 is asked after turn 1's answer with no <|endoftext|> closing it (the authors' FastChat `instella`
    template, AMD-AIG-AIMA/Instella scripts/evals/README.md), not the chat template's layout."""
    from types import SimpleNamespace

    import torch

    from instella_recipes.evaluation import judge_inputs as judge

    turns = [("user", "Q1"), ("assistant", "A1"), ("user", "Q2"), ("assistant", None)]
    assert judge.fastchat_instella_prompt(turns) == (
        "<|endoftext|><|user|>\nQ1\n<|assistant|>\nA1\n<|user|>\nQ2\n<|assistant|>\n"
    )
    assert judge.fastchat_instella_prompt(turns[:1], system="Be brief.") == "Be brief.\n<|endoftext|><|user|>\nQ1\n"

    prompts, temperatures = [], []

    def tokenize(texts, return_tensors):
        prompts.append(texts[0])
        return SimpleNamespace(input_ids=torch.zeros(1, 1, dtype=torch.long))

    def generate(model, tokenizer, input_ids, max_new_tokens, temperature):
        temperatures.append(temperature)
        return f"Answer {len(prompts)}"

    monkeypatch.setattr(judge, "generate", generate)
    rows = [{"question_id": 1, "category": "writing", "turns": ["Write.", "Shorter."]}]
    (answer,) = judge.mt_bench_answers(None, tokenize, rows, "m", 1024)
    assert prompts == [
        "<|endoftext|><|user|>\nWrite.\n<|assistant|>\n",
        "<|endoftext|><|user|>\nWrite.\n<|assistant|>\nAnswer 1\n<|user|>\nShorter.\n<|assistant|>\n",
    ]
    assert answer["choices"][0]["turns"] == ["Answer 1", "Answer 2"] and temperatures == [0.7, 0.7]
