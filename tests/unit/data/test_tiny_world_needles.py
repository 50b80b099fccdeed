"""The long-context text of the demo (data/tiny_world.py): needle documents for the 4K phase, single-needle chats for
the long SFT, needle-in-a-haystack items for tiny_niah_4k and tiny_long_ppl_4k, and the data stage writing the
documents only when asked."""

import json
import re

from instella_recipes.data.tiny_world import (
    NEEDLE,
    NEEDLE_ANSWER,
    NEEDLE_QUERY,
    TinyWorld,
    TinyWorldArguments,
    make_tiny_world,
    needle_chats,
    needle_documents,
    niah_items,
    niah_single_items,
)

# a needle, not the answer sentence after its question (which repeats the needle's words)
NEEDLE_RE = re.compile(r"(?<!\? )" + re.escape(NEEDLE).replace(r"\{key\}", r"(\w+)").replace(r"\{value\}", r"(\d{4})"))
ASKED_RE = re.compile(re.escape(NEEDLE_QUERY).replace(r"\{key\}", r"(\w+)") + r" (\d{4})\.")


def test_every_needle_is_asked_once_later_with_its_code():
    world = TinyWorld()
    docs = needle_documents(world, count=3, n_chars=3000, needles=5)
    assert docs == needle_documents(world, count=3, n_chars=3000, needles=5)  # seeded
    for doc in docs:
        text = doc["text"]
        needles = {m.group(1): (m.group(2), m.start()) for m in NEEDLE_RE.finditer(text)}
        asked = {m.group(1): (m.group(3), m.start()) for m in ASKED_RE.finditer(text)}
        assert len(needles) == len(asked) == 5 and needles.keys() == asked.keys()
        for key, (code, at) in needles.items():
            assert asked[key][0] == code and asked[key][1] > at
        assert len(text) >= 3000
        assert not set(needles) & set(world.facts)  # a needle key is never a TinyWorld country


def test_niah_items_put_one_needle_at_each_depth_and_ask_it_last():
    world = TinyWorld()
    items = niah_items(world, per_depth=2, n_chars=4000)
    assert [i["depth"] for i in items] == [0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.7, 0.7, 0.9, 0.9]
    for item in items:
        (needle,) = NEEDLE_RE.finditer(item["context"])
        key, code = needle.groups()
        assert item["target"] == f" {code}"
        assert item["context"].endswith(NEEDLE_QUERY.format(key=key))
        haystack = len(item["context"]) - len(NEEDLE_QUERY.format(key=key))
        assert abs(needle.start() / haystack - item["depth"]) < 0.08  # placed at a sentence border near the depth


def test_single_needle_items_hold_one_number_the_code_at_each_depth():
    world = TinyWorld()
    items = niah_single_items(world, per_depth=2, n_chars=4000)
    assert items == niah_single_items(world, per_depth=2, n_chars=4000)  # seeded
    assert [i["depth"] for i in items] == [0.1, 0.1, 0.3, 0.3, 0.5, 0.5, 0.7, 0.7, 0.9, 0.9]
    for item in items:
        code = item["target"][1:]
        assert re.fullmatch(r"[2-9]\d", code) and re.findall(r"\d+", item["context"]) == [code]  # RULER niah_single
        (needle,) = re.finditer(
            re.escape(NEEDLE).replace(r"\{key\}", r"(\w+)").replace(r"\{value\}", code), item["context"]
        )
        assert item["context"].endswith(f"What is the secret code of {needle.group(1)}?")
        assert abs(needle.start() / len(item["context"]) - item["depth"]) < 0.08


def test_needle_chats_are_short_and_long_single_needle_questions_with_the_code_as_answer():
    world = TinyWorld()
    chats = needle_chats(world, short=40, long=4)
    assert chats == needle_chats(world, short=40, long=4)  # seeded
    evaluated = {i["context"] for i in niah_single_items(world, per_depth=4, n_chars=13500)}
    lengths = []
    for chat in chats:
        user, assistant = chat["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        (code,) = re.findall(r"\d+", user["content"])  # the needle's code is the only number
        assert assistant["content"] == f"{NEEDLE_ANSWER} {code}." and user["content"] not in evaluated
        lengths.append(len(user["content"]))
    assert sum(n > 1000 for n in lengths) == 4 and max(n for n in lengths if n < 1000) < 600


def test_the_data_stage_writes_needle_documents_only_when_asked(tmp_path):
    make_tiny_world(TinyWorldArguments(output_dir=str(tmp_path / "plain"), n_train_problems=8, n_eval_problems=4))
    assert not (tmp_path / "plain" / "long_corpus.jsonl").exists()
    args = TinyWorldArguments(output_dir=str(tmp_path / "long"), n_train_problems=8, n_eval_problems=4, long_docs=2,
                              long_doc_chars=2000, long_needles=3)  # fmt: skip
    make_tiny_world(args)
    rows = [json.loads(line) for line in (tmp_path / "long" / "long_corpus.jsonl").open()]
    assert len(rows) == 2 and all(len(NEEDLE_RE.findall(r["text"])) == 3 for r in rows)
    manifest = json.loads((tmp_path / "long" / "manifest.json").read_text())
    assert manifest["rows"]["long_corpus"] == 2
    assert manifest["rows"]["long_sft"] == args.long_sft_short + args.long_sft_long
