"""`prepare_data --layout olmo` writes the token files the authors' tool writes.

The oracle is `dolma tokens` itself (dolma 1.1.2 from PyPI, the last release before Instella's; the authors'
scripts/prepare_pretrain_data_stage{1,2}.sh call it). It pins tokenizers<=0.19.1 and numpy<2, so it gets its own
virtual environment, made once per test session from tests/helpers/dolma_oracle_requirements.txt (its full pinned
closure) and called as an external program. The tests skip, with pip's words, only when that environment cannot be
built.

dolma never seeds the shuffles it makes (see instella_recipes/data/dolma_tokens.py), so byte identity is shown with
tests/helpers/dolma_oracle.py, which runs dolma's own CLI with its `random` module seeded as ours; the authors' exact
command line, unseeded, is compared document for document.
"""

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pytest

from instella_recipes.core import read_manifest
from instella_recipes.data.dolma_tokens import DolmaTokensArguments, group_paths, part_prefix
from instella_recipes.data.prepare import main as prepare_main

ROOT = Path(__file__).resolve().parents[3]
TOKENIZER = ROOT / "recipes" / "instella-3b" / "tokenizer" / "allenai_eleuther-ai-gpt-neox-20b-pii-special.json"

WORDS = ["alpha", "béta", "γάμμα", "数学", "🙂", "def f(x):\n    return x", "  ", "\n\n", "tab\tbed", "<|endoftext|>"]


def write_documents(folder: Path, seed: int = 1) -> list[str]:
    """Five jsonl files (plain, gzip, zstd) of documents from 1 to ~1,200 tokens, non-ASCII, empty and blank texts,
    texts that end in a literal <|endoftext|>, and every kind of row dolma 1.1 skips (no id, an int id, null text,
    a null `source`, an int `version`, NaN, a blank line, a line that is not JSON)."""
    import zstandard

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ["c.jsonl.gz", "a.jsonl", "e.json.zst", "b.jsonl.gz", "d.jsonl"]:
        lines = [
            json.dumps({"id": f"{name}-{j}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.choice(
                [1, 3, 10, 50, 200, 400])))}, ensure_ascii=rng.random() < 0.5)
            for j in range(rng.randint(5, 30))
        ]  # fmt: skip
        lines[1:1] = [json.dumps({"id": f"{name}-empty", "text": ""}), json.dumps({"id": "ws", "text": " \n\t "})]
        lines += [
            json.dumps({"id": f"{name}-eos", "text": "ends with <|endoftext|>"}),
            json.dumps({"text": "no id"}),
            json.dumps({"id": "nulltext", "text": None}),
            json.dumps({"id": "srcnull", "text": "source null", "source": None}),
            json.dumps({"id": "ver", "text": "version int", "version": 3}),
            '{"id": "nan", "text": "has nan", "score": NaN}',
            "",
            "not json",
            json.dumps({"id": 7, "text": "int id"}),
            json.dumps({"id": "last", "text": "  padded \n", "source": "s", "version": None, "meta": {"a": 1}}),
        ]
        data = ("\n".join(lines) + "\n").encode()
        if name.endswith(".gz"):
            data = gzip.compress(data)
        elif name.endswith(".zst"):
            data = zstandard.ZstdCompressor().compress(data)
        (folder / name).write_bytes(data)
    return sorted(str(p) for p in folder.iterdir())


def prepare_olmo(docs: Path, out: Path, *extra: str, destination: str = "sub") -> Path:
    source = json.dumps({"name": "t", "path": str(docs), "data_files": ["*"], "destination": destination})
    argv = ["--layout", "olmo", "--output_dir", str(out), "--sources", source, "--tokenizer", str(TOKENIZER), *extra]
    prepare_main(argv)
    return out / destination


def token_files(folder: Path) -> dict[str, bytes]:
    """Every `.npy` (bytes) and `.csv.gz` (decompressed) in a folder, by name."""
    out = {p.name: p.read_bytes() for p in folder.glob("*.npy")}
    out.update({p.name: gzip.decompress(p.read_bytes()) for p in folder.glob("*.csv.gz")})
    return out


# -- the oracle ---------------------------------------------------------------------------------------------------


# -- the rules, without the oracle ---------------------------------------------------------------------------------


def test_the_authors_file_names_follow_from_their_group_counts():
    """part-{g} is padded to the digits of the group count + 1: the names in the authors' stage-2 config
    (math/gsm8k part-0, math/tinyGSM-MIND part-00 with 20 processes, math/dolmino_math_synth part-000 with 148
    files) come out of dolma's grouping of that many files over `processes`."""
    settings = DolmaTokensArguments(processes=200)
    assert len(group_paths([f"f{i}" for i in range(148)], settings)) == 148
    assert part_prefix(147, 148) == "part-147" and part_prefix(0, 2) == "part-0" and part_prefix(19, 20) == "part-19"
    many = group_paths([f"f{i}" for i in range(1000)], settings)
    assert len(many) == 200 and sorted(sum(many, [])) == sorted(f"f{i}" for i in range(1000))
    assert part_prefix(0, 200) == "part-000"
    assert [len(g) for g in group_paths(list("abcde"), DolmaTokensArguments(processes=2))] == [2, 3]  # round(2.5) == 2


def test_eos_strip_and_skipped_rows(tmp_path, olmo_tokenizer):
    """The stripped text is tokenised; EOS (0) is appended unless the text already ends in <|endoftext|>; empty
    and invalid rows are skipped and counted."""
    docs = tmp_path / "docs"
    docs.mkdir()
    rows = [
        {"id": "a", "text": "  Hello world \n"},
        {"id": "b", "text": "ends <|endoftext|>"},
        {"id": "c", "text": "\n \t"},
        {"id": "d", "text": "Größe 数学 🙂"},
        {"id": 5, "text": "int id"},
    ]
    (docs / "x.jsonl").write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    out = prepare_olmo(docs, tmp_path / "out", "--processes", "1", "--batch_size", "1")
    ids = np.fromfile(out / "part-0-00000.npy", dtype="<u2").tolist()
    encode = lambda s: olmo_tokenizer(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    # batch_size 1 keeps file order (a one-document batch has nothing to shuffle)
    assert ids == encode("Hello world") + [0] + encode("ends <|endoftext|>") + encode("Größe 数学 🙂") + [0]
    assert encode("ends <|endoftext|>")[-1] == 0
    manifest = read_manifest(out)
    assert manifest["skipped_rows"] == {"empty_text": 1, "invalid": 1}
    assert manifest["eos_token_id"] == 0 and manifest["dtype"] == "uint16" and manifest["bos_added"] is False


@pytest.mark.parametrize(
    "case, expected",
    [
        ("no-id", "x.jsonl:1: no string 'id': dolma takes JSON lines with a string 'id'"),
        ("dest-is-file", "destination"),
        ("missing-path", "does not exist"),
        ("bad-converter", "unknown converter 'hermes'"),
        ("only-typo", "only: no source named ['tt']"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, capsys, case, expected):
    docs = tmp_path / "docs"
    docs.mkdir()
    row = {"messages": [{"role": "user", "content": "hi"}]} if case == "no-id" else {"id": "1", "text": "hi"}
    (docs / "x.jsonl").write_text(json.dumps(row) + "\n")
    out = tmp_path / "out"
    source = {"name": "t", "path": str(docs), "destination": "sub"}
    extra = []
    if case == "dest-is-file":
        out.mkdir()
        (out / "sub").write_text("a file")
    elif case == "missing-path":
        source["path"] = str(tmp_path / "nope")
    elif case == "bad-converter":
        source["converter"] = "hermes"
    elif case == "only-typo":
        extra = ["--only", "tt"]
    argv = ["--layout", "olmo", "--output_dir", str(out), "--sources", json.dumps(source), "--tokenizer",
            str(TOKENIZER), *extra]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        prepare_main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert exit_info.value.code == 2 and len(lines) == 1 and expected in lines[0], err[-2000:]
    assert not list(tmp_path.rglob("*.npy")) and not list(tmp_path.rglob("manifest.json"))


def test_sources_split_over_runs_and_the_root_manifest_comes_last(tmp_path):
    """`only` prepares some sources (one node each); `output_dir/manifest.json` appears once all are done and lists
    every token file in recipe order."""
    write_documents(tmp_path / "docs")
    sources = [
        json.dumps({"name": n, "path": str(tmp_path / "docs" / f), "destination": d})
        for n, f, d in [("a", "a.jsonl", "x/a"), ("b", "d.jsonl", "b")]
    ]
    argv = ["--layout", "olmo", "--output_dir", str(tmp_path / "mix"), "--sources", *sources, "--tokenizer",
            str(TOKENIZER), "--processes", "2", "--max_size", "6000"]  # fmt: skip
    prepare_main([*argv, "--only", "b"])
    assert read_manifest(tmp_path / "mix" / "b") is not None and read_manifest(tmp_path / "mix") is None
    prepare_main([*argv, "--only", "a"])
    root = read_manifest(tmp_path / "mix")
    assert root["token_files"][0].startswith("x/a/part-0-") and root["token_files"][-1].startswith("b/part-0-")
    assert root["num_files"] == len(list((tmp_path / "mix").rglob("*.npy")))
    digest = (tmp_path / "mix" / "manifest.json").read_bytes()
    prepare_main(argv)  # nothing to do: every folder and the root manifest stay as they are
    assert (tmp_path / "mix" / "manifest.json").read_bytes() == digest


def test_a_hub_source_fetches_only_its_files_into_raw_dir_and_then_reads_them_there(tmp_path, monkeypatch):
    """A Hub dataset source downloads the files matching its data_files (the authors' --documents globs) into
    raw_dir/<repo name>/, the authors' datasets/ layout; once there, they are read without the Hub."""
    import huggingface_hub

    calls = []

    def fake_snapshot_download(repo_id, repo_type, revision, allow_patterns, local_dir):
        calls.append((repo_id, repo_type, allow_patterns, Path(local_dir)))
        write_documents(Path(local_dir) / "data" / "flan")
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    source = json.dumps({"name": "flan", "path": "allenai/dolmino-mix-1124", "data_files": ["data/flan/*.jsonl*"],
                         "destination": "flan"})  # fmt: skip
    argv = ["--layout", "olmo", "--output_dir", str(tmp_path / "mix"), "--raw_dir", str(tmp_path / "datasets"),
            "--sources", source, "--tokenizer", str(TOKENIZER), "--max_size", "100000"]  # fmt: skip
    prepare_main(argv)
    assert calls == [("allenai/dolmino-mix-1124", "dataset", ["data/flan/*.jsonl*"], tmp_path / "datasets" /
                      "dolmino-mix-1124")]  # fmt: skip
    inputs = [f[0] for f in read_manifest(tmp_path / "mix" / "flan")["inputs"]["files"]]
    assert [Path(p).name for p in inputs] == ["a.jsonl", "b.jsonl.gz", "c.jsonl.gz", "d.jsonl"]  # not e.json.zst
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("went to the Hub"))
    prepare_main([*argv, "--overwrite", "true", "--seed", "1"])
