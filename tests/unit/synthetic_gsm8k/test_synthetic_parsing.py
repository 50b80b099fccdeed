"""Seed rows, model replies and the journal: each bad input maps to its named rejection reason."""

import json

import pytest

from instella_recipes.synthetic_gsm8k.backends import OpenAIBackend, Request
from instella_recipes.synthetic_gsm8k.journal import Journal
from instella_recipes.synthetic_gsm8k.parsing import (
    Rejected,
    extract_code,
    final_answer,
    parse_abstraction,
    parse_seed,
    parse_variants,
    rewritten_ok,
    substitute,
)


def reason(fn, *args):
    with pytest.raises(Rejected) as info:
        fn(*args)
    return info.value.reason


def test_seed_rows():
    assert parse_seed({"question": " Q? ", "answer": "steps\n#### 1,234"}) == ("Q?", 1234)
    assert parse_seed({"question": "Q?", "answer": "#### 2.5"}) == ("Q?", 2.5)
    assert reason(parse_seed, {"question": "Q?", "answer": "42"}) == "seed_no_answer_marker"
    assert reason(parse_seed, {"question": "Q?", "answer": "#### forty"}) == "seed_non_numeric_answer"
    assert reason(parse_seed, {"answer": "#### 4"}) == "seed_missing_question"
    assert reason(parse_seed, {"_unparsable_line": 3}) == "seed_unparsable"


def test_abstraction_replies():
    reply = 'Sure!\n```json\n{"question": "Tom has {apples} apples.", "parameters": {"apples": "3"}}\n```'
    assert parse_abstraction(reply) == ("Tom has {apples} apples.", {"apples": 3})
    assert reason(parse_abstraction, "no json here") == "abstract_unparsable"
    assert reason(parse_abstraction, '{"question": "Tom has {a} apples.", "parameters": {"b": 3}}') == (
        "abstract_invalid"
    )
    assert reason(parse_abstraction, '{"question": "{a}", "parameters": {"a": "many"}}') == "abstract_invalid"
    assert reason(parse_abstraction, '{"question": "{a}", "parameters": {"a": true}}') == "abstract_invalid"
    assert reason(parse_abstraction, '{"question": "{__class__}", "parameters": {"__class__": 1}}') == (
        "abstract_invalid"
    )


def test_program_and_variant_replies():
    assert extract_code("x\n```python\ndef answer(a):\n    return a\n```\n") == "def answer(a):\n    return a\n"
    assert reason(extract_code, "I would add the numbers.") == "program_unparsable"
    valid, invalid = parse_variants('[{"a": 1}, {"a": 2}, {"a": 2}, {"b": 1}, {"a": "x"}, {"a": 9}]', {"a"}, {"a": 9})
    assert valid == [{"a": 1}, {"a": 2}] and invalid == 4  # duplicate, wrong name, non-number, the original
    assert parse_variants('{"sets": [{"a": 5}]}', {"a"}, {"a": 1}) == ([{"a": 5}], 0)
    assert reason(parse_variants, "none", {"a"}, {"a": 1}) == "variants_unparsable"


def test_rewrite_and_final_answer():
    assert substitute("Pay ${price} for {n} pens.", {"price": 2.5, "n": 3}) == "Pay $2.5 for 3 pens."
    assert rewritten_ok("Pay $2.50 for 3 pens.", {"price": 2.5, "n": 3})
    assert not rewritten_ok("Pay $2.50 for some pens.", {"price": 2.5, "n": 3})
    assert not rewritten_ok("Pay ${price} for 3 pens.", {"price": 2.5, "n": 3})
    assert final_answer("3 + 4 = 7. The answer is 7.") == 7
    assert final_answer("The answer is 5. Wait. The answer is $1,200.") == 1200
    assert final_answer("The final answer is -2.5") == -2.5
    assert final_answer("It is seven.") is None


def test_journal_ignores_and_repairs_a_torn_last_line(tmp_path):
    journal = Journal(tmp_path)
    journal.append("s", {"event": "round", "round": 0})
    with open(journal.path("s"), "ab") as handle:
        handle.write(b'{"event": "variants", "vari')  # killed in the middle of a write
    assert journal.read("s") == [{"event": "round", "round": 0}]
    journal.append("s", {"event": "variants", "variants": []})
    lines = journal.path("s").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["round", "variants"]


def test_http_backend_reports_unreachable_server_as_a_failed_reply_with_the_error():
    backend = OpenAIBackend("http://127.0.0.1:9/v1", "m", max_retries=0, timeout=2)
    (reply,) = backend.generate([Request([{"role": "user", "content": "hi"}])])
    assert reply == [] and "APIConnectionError" in reply.error
    assert "http://127.0.0.1:9/v1" in reply.error  # the URL it tried: a wrong port or a server not started yet


def test_http_backend_retries_a_failing_server_with_the_clients_backoff_then_fails():
    from tests.helpers.synthetic_fakes import OracleServer

    with OracleServer(fail_first=5) as server:
        backend = OpenAIBackend(server.url, "m", max_retries=2, max_concurrency=1)
        (reply,) = backend.generate([Request([{"role": "user", "content": "hi"}])])
    assert reply == [] and "503" in reply.error
    assert len(server.log) == 3  # the first try and max_retries=2 retries, then the error is reported


def test_shipped_recipes_parse():
    from pathlib import Path

    from instella_recipes.core import parse_recipe
    from instella_recipes.synthetic_gsm8k.run import SyntheticGSM8KArguments

    recipes = sorted((Path(__file__).resolve().parents[3] / "recipes" / "synthetic_gsm8k").glob("*.yaml"))
    assert len(recipes) >= 3
    for recipe in recipes:
        (args,) = parse_recipe([SyntheticGSM8KArguments], ["--config", str(recipe)])
        assert args.seeds and args.model and args.sandbox == "bwrap"
        first = recipe.read_text().splitlines()[0]
        assert first.startswith("# ") and "batch" in recipe.read_text().split("\n\n")[0].lower()


def test_http_backend_retries_and_tops_up_missing_choices():
    from tests.helpers.synthetic_fakes import TABLE, OracleServer

    question = TABLE[0]["masked"].format(**TABLE[0]["params"])
    cot = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
    cot.append({"role": "user", "content": f"Question: {question}\nLet's think step by step."})
    with OracleServer(max_n=1, fail_first=1) as server:
        backend = OpenAIBackend(server.url, "m", max_retries=2, max_concurrency=1)
        (replies,) = backend.generate([Request(cot, n=3, seed=7)])
    assert len(replies) == 3 and all(r.endswith("The answer is 39.") for r in replies)
    # one 503 retried, then one request per missing choice, each with its own seed
    assert [body["n"] for body in server.log] == [3, 3, 2, 1]
    assert [body["seed"] for body in server.log[1:]] == [7, 8, 9]


def test_parquet_and_missing_seed_files(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from instella_recipes.core import RecipeError
    from instella_recipes.synthetic_gsm8k.run import read_seeds

    rows = [{"question": "Q1?", "answer": "#### 1"}, {"question": "Q2?", "answer": "#### 2"}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "seeds.parquet")
    assert read_seeds(str(tmp_path / "seeds.parquet"), max_rows=1) == rows[:1]
    with pytest.raises(RecipeError, match="does not exist"):
        read_seeds(str(tmp_path / "nope.parquet"))
    (tmp_path / "seeds.csv").write_text("question,answer\n")
    with pytest.raises(RecipeError, match="expected .jsonl, .json or .parquet"):
        read_seeds(str(tmp_path / "seeds.csv"))
