"""`prepare_data --layout olmo` beyond dolma's bytes: a source's seeded sample (a fraction of its documents or a
number of its files), the output-folder rule for `output_dir` and every destination, the integrity records of the
manifests, and the token list it writes last."""

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from instella_recipes.core import RecipeError, read_manifest
from instella_recipes.data.dolma_tokens import open_text
from instella_recipes.data.prepare import main as prepare_main
from instella_recipes.data.sampling import DocumentSample
from instella_recipes.data.token_files import read_path_list
from tests.helpers.argv import overriding
from tests.unit.data.test_dolma_tokens import TOKENIZER, token_files, write_documents

SETTINGS = ["--processes", "3", "--max_size", "6000", "--batch_size", "3"]


def _kept_ids(folder: Path) -> list[str]:
    """The document ids of every token file's metadata in a destination, sorted."""
    ids = []
    for path in folder.glob("*.csv.gz"):
        ids += [row.split(",")[2] for row in gzip.decompress(path.read_bytes()).decode().splitlines()]
    return sorted(ids)


def _write_like(path: Path, lines: list[str]) -> None:
    """`lines` into `path`, compressed as its name says (what dolma and we infer from the extension)."""
    import zstandard

    data = "".join(lines).encode()
    if path.name.endswith(".gz"):
        data = gzip.compress(data)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)


def _prepare(docs: Path, out: Path, *extra: str, **source) -> Path:
    spec = {"name": "t", "path": str(docs), "data_files": ["*"], "destination": "sub", **source}
    argv = overriding(["--layout", "olmo", "--output_dir", str(out), "--sources", json.dumps(spec), "--tokenizer",
                       str(TOKENIZER), *SETTINGS], list(extra))  # fmt: skip
    prepare_main(argv)
    return out / "sub"


def test_a_document_sample_is_dolma_over_the_kept_lines(tmp_path):
    """sample {fraction: p} writes the bytes the whole pipeline writes over the same files with the other lines
    removed (each line kept by a keyed hash of seed, source, file and line number), and records what it kept."""
    files = write_documents(tmp_path / "docs")
    sampled = _prepare(tmp_path / "docs", tmp_path / "out", sample={"fraction": 0.5})
    keep = DocumentSample(0.5, 0, "t", str(tmp_path / "docs"))
    (tmp_path / "filtered").mkdir()
    lines_read = lines_kept = 0
    for path in files:
        with open_text(path) as handle:
            lines = list(handle)
        kept = [line for loc, line in enumerate(lines, 1) if keep.selector(path)(loc)]
        lines_read, lines_kept = lines_read + len(lines), lines_kept + len(kept)
        _write_like(tmp_path / "filtered" / Path(path).name, kept)
    whole = _prepare(tmp_path / "filtered", tmp_path / "whole")
    npy = lambda folder: {k: v for k, v in token_files(folder).items() if k.endswith(".npy")}  # noqa: E731
    assert npy(sampled) == npy(whole) and 0 < lines_kept < lines_read
    record = read_manifest(sampled)["sample"]
    assert (record["lines_read"], record["lines_kept"], record["fraction"]) == (lines_read, lines_kept, 0.5)
    # another share of the same files is other inputs: refused unless --overwrite
    with pytest.raises(SystemExit):
        _prepare(tmp_path / "docs", tmp_path / "out", sample={"fraction": 0.25})
    assert read_manifest(sampled)["sample"]["fraction"] == 0.5


def test_a_file_sample_keeps_n_files_each_its_own_group(tmp_path):
    """sample {files: n} with files_per_process 1: n of the input files (seeded), one group and file each."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(12):
        (docs / f"f{i:02d}.jsonl").write_text(json.dumps({"id": f"d{i}", "text": f"document {i}"}) + "\n")
    out = _prepare(docs, tmp_path / "out", sample={"files": 5}, files_per_process=1)
    manifest = read_manifest(out)
    assert [f["file"] for f in manifest["token_files"]] == [f"part-{g}-00000.npy" for g in range(5)]
    assert manifest["sample"] == {"files": 5, "seed": 0, "of_files": 12}
    assert len(manifest["inputs"]["files"]) == 5 and len(set(_kept_ids(out))) == 5
    again = _prepare(docs, tmp_path / "again", sample={"files": 5}, files_per_process=1)
    assert _kept_ids(again) == _kept_ids(out)
    with pytest.raises(RecipeError, match="sample.files is 13, but only 12 input files match"):
        from instella_recipes.data.olmo_layout import TokenSource, _input_files

        source = TokenSource.from_recipe(
            0, {"name": "t", "path": str(docs), "destination": "x", "sample": {"files": 13}}
        )
        _input_files(type("A", (), {"seed": 0, "raw_dir": None})(), source)


def test_the_token_list_is_read_against_the_manifests_beside_it(tmp_path):
    """The reader checks each listed file's size against the manifest beside it, and the list's own size against
    output_dir's manifest: a cut file or an added one is named before training."""
    write_documents(tmp_path / "docs")
    dest = _prepare(tmp_path / "docs", tmp_path / "out")
    listing = tmp_path / "out" / "token_files.txt"
    entries, _ = read_path_list(str(listing), str(tmp_path / "out"))
    first = tmp_path / "out" / entries[0]
    np.fromfile(first, dtype="<u2")[:-1].tofile(first)
    with pytest.raises(RecipeError, match=rf"token_files.txt:1: token file {first} is \d+ bytes, the manifest.json"):
        read_path_list(str(listing), str(tmp_path / "out"))
    extra = dest / "part-9-00000.npy"
    np.zeros(8, dtype="<u2").tofile(extra)
    with pytest.raises(RecipeError, match="part-9-00000.npy is not one of the files the manifest.json beside it"):
        read_path_list([str(extra)])
    listing.write_text(listing.read_text() + "sub/part-9-00000.npy\n")
    with pytest.raises(RecipeError, match=r"list file .*token_files.txt is \d+ bytes, the manifest.json beside it"):
        read_path_list(str(listing), str(tmp_path / "out"))


def test_a_damaged_folder_is_not_up_to_date_and_overwrite_writes_it_again(tmp_path):
    """Issue 32: a rerun on a folder whose token file lost a bit after its manifest refuses it (naming the file)
    instead of calling it "up to date"; with --overwrite true it writes the same bytes again."""
    write_documents(tmp_path / "docs")
    folder = _prepare(tmp_path / "docs", tmp_path / "out")
    target = sorted(folder.glob("part-*.npy"))[0]
    good = target.read_bytes()
    target.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    with pytest.raises(SystemExit) as exit_info:
        _prepare(tmp_path / "docs", tmp_path / "out")
    assert exit_info.value.code == 2
    _prepare(tmp_path / "docs", tmp_path / "out", "--overwrite", "true")
    assert target.read_bytes() == good
