"""The end-to-end half of tests/unit/data/test_dolma_tokens.py (the oracle and why it is seeded: its docstring):
`prepare_data --layout olmo` against `dolma tokens` 1.1.2 itself, run as an external program from its own virtual
environment (tests/helpers/dolma_oracle_requirements.txt).
"""

import gzip
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from instella_recipes.core import RecipeError, read_manifest
from instella_recipes.data import dolma_tokens
from instella_recipes.data.dolma_tokens import DolmaTokensArguments
from tests.unit.data import test_dolma_tokens as unit_half  # fixtures and helpers both halves use

ROOT, TOKENIZER, WORDS, prepare_olmo, token_files, write_documents = (
    unit_half.ROOT,
    unit_half.TOKENIZER,
    unit_half.WORDS,
    unit_half.prepare_olmo,
    unit_half.token_files,
    unit_half.write_documents,
)


REQUIREMENTS = ROOT / "tests/helpers/dolma_oracle_requirements.txt"


ORACLE = ROOT / "tests/helpers/dolma_oracle.py"


@pytest.fixture(scope="session")
def dolma_python(tmp_path_factory):
    """Python of a fresh venv holding dolma 1.1.2 (about 40 s to build; pip output on failure)."""
    venv = tmp_path_factory.mktemp("dolma_oracle") / "venv"
    start = time.monotonic()
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "-r", str(REQUIREMENTS)],
    ]  # fmt: skip
    for step in steps:
        try:
            subprocess.run(step, check=True, capture_output=True, text=True, timeout=900)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            tail = ((getattr(err, "stderr", "") or "") + (getattr(err, "stdout", "") or ""))[-600:]
            pytest.skip(f"cannot build dolma 1.1.2's own venv from PyPI ({' '.join(step[:4])} ...): {tail}")
    sys.stderr.write(f"\n[dolma oracle venv built in {time.monotonic() - start:.0f} s]\n")
    # dolma imports nltk and downloads its sentence splitter unless one is found: an empty one stops the download
    (venv.parent / "nltk_data" / "tokenizers" / "punkt").mkdir(parents=True)
    return venv / "bin" / "python"


def run_dolma(python: Path, argv: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["NLTK_DATA"] = str(python.parents[2] / "nltk_data")
    result = subprocess.run([str(python), *argv], capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


def dolma_argv(files: list[str], dest: Path, max_size: int, processes: int, seed: int = 0) -> list[str]:
    """The authors' flags (prepare_pretrain_data_stage2.sh): the shell expands their globs into sorted paths."""
    return ["tokens", "--documents", *files, "--destination", str(dest), "--tokenizer.name_or_path", str(TOKENIZER),
            "--max_size", str(max_size), "--seed", str(seed), "--tokenizer.eos_token_id", "0",
            "--tokenizer.pad_token_id", "1", "--processes", str(processes)]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(
    "processes, batch_size, ring_size, max_size, seed",
    [(2, 3, 8, 6000, 0), (3, 7, 2, 8000, 5)],
    ids=["2-groups-batches-of-3", "3-groups-ring-of-2"],
)
def test_token_files_are_byte_identical_to_dolma(
    dolma_python, tmp_path, processes, batch_size, ring_size, max_size, seed
):
    """Same file names, same .npy bytes, same metadata rows; the files split at max_size (several per group)."""
    files = write_documents(tmp_path / "docs")
    argv = dolma_argv(files, tmp_path / "dolma", max_size, processes, seed)
    run_dolma(dolma_python, [str(ORACLE), str(seed), *argv, "--batch_size", str(batch_size), "--ring_size",
                             str(ring_size), "--debug"])  # fmt: skip
    ours = prepare_olmo(
        tmp_path / "docs", tmp_path / "ours", "--max_size", str(max_size), "--processes", str(processes),
        "--batch_size", str(batch_size), "--ring_size", str(ring_size), "--seed", str(seed),
    )  # fmt: skip
    expected, got = token_files(tmp_path / "dolma"), token_files(ours)
    assert sorted(got) == sorted(expected)
    assert len([n for n in expected if n.endswith(".npy")]) > processes  # files were split at max_size
    for name in expected:
        assert got[name] == expected[name], name
    manifest = read_manifest(ours)
    assert manifest["total_tokens"] == sum(len(v) // 2 for k, v in expected.items() if k.endswith(".npy"))
    assert manifest["skipped_rows"]["invalid"] == 5 * 8


@pytest.mark.slow
def test_the_authors_unseeded_command_writes_the_same_documents_into_the_same_files(dolma_python, tmp_path):
    """The authors' command as is (`--processes 200`, default batches, spawned workers, no seed reaching the
    shuffles): each part file holds exactly the documents of ours (order aside), with the same name set."""
    files = write_documents(tmp_path / "docs", seed=2)
    run_dolma(dolma_python, ["-m", "dolma.cli.__main__", *dolma_argv(files, tmp_path / "dolma", 10**7, 200)])
    ours = prepare_olmo(tmp_path / "docs", tmp_path / "ours", "--max_size", str(10**7), "--processes", "200")

    def documents(folder: Path) -> dict[str, Counter]:
        out = {}
        for npy in folder.glob("*.npy"):
            ids = np.fromfile(npy, dtype="<u2")
            rows = gzip.decompress(npy.with_suffix(".csv.gz").read_bytes()).decode().splitlines()
            out[npy.name] = Counter(tuple(ids[int(r.split(",")[0]) : int(r.split(",")[1])]) for r in rows)
        return out

    theirs, mine = documents(tmp_path / "dolma"), documents(ours)
    assert sorted(theirs) == sorted(mine) == [f"part-{g}-00000.npy" for g in range(5)]
    # which file becomes part-g is the unseeded path shuffle: compare the five files as a set
    assert sorted(map(sorted, theirs.values())) == sorted(map(sorted, mine.values()))


def test_worker_processes_do_not_change_the_bytes(tmp_path):
    write_documents(tmp_path / "docs")
    settings = ["--processes", "3", "--max_size", "6000", "--batch_size", "3"]
    one = token_files(prepare_olmo(tmp_path / "docs", tmp_path / "one", *settings))
    two = token_files(prepare_olmo(tmp_path / "docs", tmp_path / "two", *settings, "--num_proc", "2"))
    assert one == two


def test_a_document_dolma_would_silently_drop_is_an_error(tmp_path, capsys):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "x.jsonl").write_text(json.dumps({"id": "long", "text": "word " * 300}) + "\n")
    (docs / "y.jsonl").write_text(json.dumps({"id": "short", "text": "word"}) + "\n")
    with pytest.raises(SystemExit):  # raised in a worker process, reported by the parent as one line
        prepare_olmo(docs, tmp_path / "out", "--max_size", "100", "--processes", "2", "--num_proc", "2")
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "x.jsonl:1: a batch of documents does not fit" in lines[0]
    assert not (tmp_path / "out" / "sub").exists()
    with pytest.raises(RecipeError, match="x.jsonl:1: a batch of documents does not fit"):
        dolma_tokens.write_group(
            0, [str(docs / "x.jsonl")], tmp_path / "p", dolma_tokens_tokenizer(), 0, np.dtype("<u2"),
            DolmaTokensArguments(max_size=100),
        )  # fmt: skip


def dolma_tokens_tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(TOKENIZER))
