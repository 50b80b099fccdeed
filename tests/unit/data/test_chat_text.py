"""Chat SFT sets as stage-2 text, against strings derived by hand from the rules of the authors'
scripts/convert_sft_data.py (f00a236): each message's content `.strip()` + "\\n", in order, no role tags, system
messages kept, empty messages kept as "\\n", no row dropped; records `{"id": "<dataset>-<i>", "text", "source"}`."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from instella_recipes.core import RecipeError, read_manifest
from instella_recipes.data.chat_text import chat_text, openhermes, text_records
from instella_recipes.data.prepare import main as prepare_main

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = ROOT / "recipes" / "instella-3b" / "tokenizer" / "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"

HERMES = {
    "conversations": [
        {"from": "system", "value": "  You are helpful. "},
        {"from": "human", "value": "What is 2+2?\n"},
        {"from": "gpt", "value": " 4 "},
    ]
}
WEBINSTRUCT = {"question": " Why is the sky blue?\n", "answer": "Rayleigh scattering.\n\n"}
MESSAGES = [
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": ""},
                  {"role": "user", "content": " b"}]},
    {"messages": []},
    {"messages": [{"role": "system", "content": "Sé breve."}, {"role": "user", "content": "数学?"},
                  {"role": "assistant", "content": "\t🙂\n"}]},
]  # fmt: skip


def test_openhermes_text():
    [record] = text_records([HERMES], "openhermes", "OpenHermes")
    assert record == {"id": "OpenHermes-0", "text": "You are helpful.\nWhat is 2+2?\n4\n", "source": "OpenHermes"}


def test_webinstructsub_text():
    [record] = text_records([WEBINSTRUCT], "webinstructsub", "WebInstructSub")
    assert record["text"] == "Why is the sky blue?\nRayleigh scattering.\n"


def test_messages_text_keeps_empty_messages_and_rows_and_system_turns():
    records = list(text_records(MESSAGES, "messages", "tulu-3"))
    assert [r["text"] for r in records] == ["a\n\nb\n", "", "Sé breve.\n数学?\n🙂\n"]
    assert [r["id"] for r in records] == ["tulu-3-0", "tulu-3-1", "tulu-3-2"]


def test_unreadable_rows_name_the_source_and_row():
    with pytest.raises(RecipeError, match=r"source 'OpenHermes' row 1: .*'from' is 'bot'"):
        list(text_records([HERMES, {"conversations": [{"from": "bot", "value": "x"}]}], "openhermes", "OpenHermes"))
    with pytest.raises(RecipeError, match=r"row 0: no field 'answer' \(fields: \['question'\]\)"):
        list(text_records([{"question": "q"}], "webinstructsub", "WebInstructSub"))
    with pytest.raises(RecipeError, match="content is NoneType, not text"):
        list(text_records([{"messages": [{"role": "user", "content": None}]}], "messages", "tulu-3"))
    assert chat_text([]) == "" and openhermes({"conversations": []}) == []


def test_a_chat_set_becomes_the_authors_token_file(tmp_path, olmo_tokenizer):
    """Rows -> `raw_dir/<name>/data.jsonl.gz` -> `sft/OpenHermes/part-0-00000.npy`, the file the authors' configs
    name; each document is the stripped text + EOS, the all-empty row is skipped by the tokeniser (as dolma does)."""
    rows = [HERMES, {"conversations": [{"from": "human", "value": "  "}]}, {"conversations": [
        {"from": "human", "value": "Größe?"}, {"from": "gpt", "value": "groß"}]}]  # fmt: skip
    src = tmp_path / "hermes.jsonl"
    src.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    source = {"name": "OpenHermes", "path": str(src), "converter": "openhermes", "destination": "sft/OpenHermes"}
    argv = ["--layout", "olmo", "--output_dir", str(tmp_path / "mix"), "--raw_dir", str(tmp_path / "raw"),
            "--sources", json.dumps(source), "--tokenizer", str(TOKENIZER), "--processes", "200",
            "--batch_size", "1"]  # fmt: skip
    prepare_main(argv)
    with gzip.open(tmp_path / "raw" / "OpenHermes" / "data.jsonl.gz", "rt") as handle:
        written = [json.loads(line) for line in handle]
    assert [r["text"] for r in written] == ["You are helpful.\nWhat is 2+2?\n4\n", "\n", "Größe?\ngroß\n"]
    out = tmp_path / "mix" / "sft" / "OpenHermes"
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json", "part-0-00000.csv.gz", "part-0-00000.npy"]
    encode = lambda s: olmo_tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    ids = np.fromfile(out / "part-0-00000.npy", dtype="<u2").tolist()
    assert ids == encode("You are helpful.\nWhat is 2+2?\n4") + [0] + encode("Größe?\ngroß") + [0]
    assert read_manifest(out)["skipped_rows"] == {"empty_text": 1, "invalid": 0}
    prepare_main(argv)  # the second run reuses the converted text and the token files


# The authors' stage-2 file list by folder (configs/instella-3b-pretrain-stage2-seed-*.yaml; SPEC.md 2.2).
STAGE2_FILES = {
    "dclm": 47, "dm_maths": 351, "flan": 17, "math/dolmino_math_synth": 148, "math/mathcoder2": 200,
    "math/tinyGSM-MIND": 20, "math/tulu_math": 22, "math/gsm8k": 2, "math/metamath": 1, "pes2o": 6,
    "stackexchange": 16, "wiki": 3, "python-edu": 1, "sft/OpenHermes": 1, "sft/WebInstructSub": 1,
    "sft/code-feedback": 1, "sft/tulu-3": 1, "sft/ultrachat-200k": 1, "instella-gsm8k-synthetic": 1,
}  # fmt: skip
STAGE1_FOLDERS = {"algebraic-stack", "arxiv", "dclm", "open-web-math", "pes2o", "starcoder", "wiki"}


def test_the_prepare_recipes_write_the_authors_folders_with_their_tokenizer():
    stage2 = yaml.safe_load((ROOT / "recipes/instella-3b/prepare_stage2.yaml").read_text())
    stage1 = yaml.safe_load((ROOT / "recipes/instella-3b/prepare_stage1.yaml").read_text())
    assert sum(STAGE2_FILES.values()) == 840
    # under output_dir (the pretrain recipes' data_root), the folders the authors' configs name
    stage2_root, stage1_root = "datasets/instella-stage2-mix-tokenized/", "datasets/OLMoE-mix-0924-tokenized/"
    assert {s["destination"] for s in stage2["sources"]} == {stage2_root + d for d in STAGE2_FILES}
    assert {s["destination"] for s in stage1["sources"]} == {stage1_root + d for d in STAGE1_FOLDERS}
    assert stage2["output_dir"] == "runs/instella-3b/prepare_stage2"
    assert stage1["output_dir"] == "runs/instella-3b/prepare_stage1"
    for recipe in (stage1, stage2):
        assert recipe["layout"] == "olmo" and recipe["seed"] == 0 and recipe["processes"] == 200
        assert (ROOT / recipe["tokenizer"]).read_bytes() == TOKENIZER.read_bytes()
    assert (stage1["max_size"], stage2["max_size"]) == (2_147_483_648, 1_147_483_648)
    chat = {s["name"]: (s["path"], s["split"], s["converter"]) for s in stage2["sources"] if s.get("converter")}
    assert chat == {
        "tulu-3": ("allenai/tulu-3-sft-mixture", "train", "messages"),
        "code-feedback": ("m-a-p/Code-Feedback", "train", "messages"),
        "OpenHermes": ("teknium/OpenHermes-2.5", "train", "openhermes"),
        "WebInstructSub": ("TIGER-Lab/WebInstructSub", "train", "webinstructsub"),
        "ultrachat-200k": ("HuggingFaceH4/ultrachat_200k", "train_sft", "messages"),
        "instella-gsm8k-synthetic": ("amd/Instella-GSM8K-synthetic", "train_119K", "messages"),
    }
    processes = {s["name"]: s.get("processes") for s in stage2["sources"] if s.get("processes")}
    assert processes == {"tinyGSM-MIND": 20, "pes2o": 220}
