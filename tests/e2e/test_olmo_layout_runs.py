"""The end-to-end half of tests/unit/data/test_olmo_layout.py
(processes, whole runs, oracles); the in-process tests are there.

`prepare_data --layout olmo` beyond dolma's bytes: a source's seeded sample (a fraction of its documents or a
number of its files), the output-folder rule for `output_dir` and every destination, the integrity records of the
manifests, and the token list it writes last."""

import json

import pytest

from instella_recipes.core import fast_digest, read_manifest, verify_files, write_manifest
from instella_recipes.data.prepare import main as prepare_main
from instella_recipes.data.token_files import read_path_list
from tests.unit.data import test_olmo_layout as unit_half  # fixtures and helpers both halves use
from tests.unit.data.test_dolma_tokens import TOKENIZER, write_documents

SETTINGS, _kept_ids, _prepare = unit_half.SETTINGS, unit_half._kept_ids, unit_half._prepare


def test_the_sample_does_not_depend_on_grouping_workers_or_where_the_files_are(tmp_path):
    write_documents(tmp_path / "docs")
    one = _kept_ids(_prepare(tmp_path / "docs", tmp_path / "one", "--processes", "1", sample={"fraction": 0.3}))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "docs").rename(tmp_path / "elsewhere" / "docs")
    other = _prepare(tmp_path / "elsewhere" / "docs", tmp_path / "two", "--num_proc", "2", sample={"fraction": 0.3})
    assert _kept_ids(other) == one
    everything = _kept_ids(_prepare(tmp_path / "elsewhere" / "docs", tmp_path / "all"))
    assert set(one) < set(everything) and len(one) < 0.6 * len(everything)


def test_manifests_record_every_file_and_the_list_comes_last(tmp_path, capsys):
    """Each destination's manifest has the size and xxh3 of every file (hashed as written, equal to a re-read);
    output_dir gets token_files.txt (a data_paths list), then its manifest, which describes the list and the
    destinations' manifests; a resumed or reused folder is verified too."""
    write_documents(tmp_path / "docs")
    sources = [json.dumps({"name": n, "path": str(tmp_path / "docs" / f), "destination": d})
               for n, f, d in [("a", "a.jsonl", "x/a"), ("b", "d.jsonl", "b")]]  # fmt: skip
    argv = ["--layout", "olmo", "--output_dir", str(tmp_path / "mix"), "--sources", *sources, "--tokenizer",
            str(TOKENIZER), "--processes", "2", "--max_size", "6000"]  # fmt: skip
    prepare_main(argv)
    root = tmp_path / "mix"
    for dest in ("x/a", "b"):
        listed = read_manifest(root / dest)["integrity"]["files"]
        names = sorted(p.name for p in (root / dest).iterdir() if p.name != "manifest.json")
        assert sorted(listed) == names and any(n.endswith(".csv.gz") for n in names)
        assert all(listed[n]["xxh3_128"] == fast_digest(root / dest / n) for n in names)
    manifest = read_manifest(root)
    assert sorted(manifest["integrity"]["files"]) == ["b/manifest.json", "token_files.txt", "x/a/manifest.json"]
    verify_files(root, manifest)
    entries, paths = read_path_list(str(root / "token_files.txt"), str(root))
    assert entries == manifest["token_files"] and entries[0].startswith("x/a/") and entries[-1].startswith("b/")

    # a source rebuilt: the root's manifest and list go first, and come back once every folder is done
    with pytest.raises(SystemExit):
        prepare_main([*argv, "--only", "b", "--seed", "1"])  # other inputs without --overwrite: refused, untouched
    assert read_manifest(root) == manifest
    prepare_main([*argv, "--only", "b", "--seed", "1", "--overwrite", "true"])
    rebuilt = read_manifest(root)
    assert rebuilt["sources"]["b"]["fingerprint"] == read_manifest(root / "b")["fingerprint"]
    assert rebuilt["sources"]["b"] != manifest["sources"]["b"] and rebuilt["sources"]["a"] == manifest["sources"]["a"]
    verify_files(root, rebuilt)

    # a folder whose token file was cut after its manifest: named when it would be reused
    token = root / "x" / "a" / entries[0].rsplit("/", 1)[-1]
    token.write_bytes(token.read_bytes()[:-2])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        prepare_main([*argv, "--only", "a"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and f"{token.name} is {token.stat().st_size} bytes, its manifest.json says" in lines[0]


def test_a_complete_output_of_another_stage_is_replaced_only_with_overwrite(tmp_path, capsys):
    """output_dir or a destination holding another stage's complete output: refused (one line) without
    --overwrite; with it, the old manifest goes first and the folder is replaced."""
    write_documents(tmp_path / "docs")
    for target in ("root", "destination"):
        out = tmp_path / target
        folder = out if target == "root" else out / "sub"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"weights")
        write_manifest(folder, "sft", global_step=3)
        with pytest.raises(SystemExit) as exit_info:
            _prepare(tmp_path / "docs", out)
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
        assert exit_info.value.code == 2 and len(lines) == 1 and "holds a complete 'sft' output" in lines[0]
        assert read_manifest(folder)["stage"] == "sft" and not list(out.rglob("*.npy"))
        dest = _prepare(tmp_path / "docs", out, "--overwrite", "true")
        assert read_manifest(dest)["stage"] == "prepare_data" and read_manifest(out)["layout"] == "olmo"
        assert not (folder / "model.safetensors").exists()
