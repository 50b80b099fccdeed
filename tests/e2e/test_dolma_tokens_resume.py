"""The end-to-end half of tests/unit/data/test_dolma_tokens.py: a `prepare_data --layout olmo` run killed inside a
group resumes at the next group and writes the bytes of a clean run, checksums holding; a third run reuses it all."""

import pytest

from instella_recipes.core import read_manifest, verify_files
from instella_recipes.data import dolma_tokens
from tests.unit.data.test_dolma_tokens import prepare_olmo, token_files, write_documents


def test_a_killed_run_resumes_at_the_next_group_and_writes_the_same_bytes(tmp_path, monkeypatch):
    write_documents(tmp_path / "docs")
    settings = ["--processes", "3", "--max_size", "6000", "--batch_size", "3"]
    clean = token_files(prepare_olmo(tmp_path / "docs", tmp_path / "clean", *settings))
    original = dolma_tokens.write_group

    def dies_on_group_2(group, *args, **kwargs):
        if group == 2:
            raise KeyboardInterrupt
        return original(group, *args, **kwargs)

    monkeypatch.setattr(dolma_tokens, "write_group", dies_on_group_2)
    with pytest.raises(SystemExit) as stopped:  # Ctrl-C: one line, exit 130 (core/errors.py)
        prepare_olmo(tmp_path / "docs", tmp_path / "resumed", *settings)
    assert stopped.value.code == 130
    partial = tmp_path / "resumed" / "sub.partial"
    assert not (tmp_path / "resumed" / "sub").exists() and not (partial / "manifest.json").exists()
    first = {p.name: p.stat().st_mtime_ns for p in partial.glob("part-0-*")}
    assert first
    monkeypatch.setattr(dolma_tokens, "write_group", original)
    resumed = prepare_olmo(tmp_path / "docs", tmp_path / "resumed", *settings)
    assert token_files(resumed) == clean
    verify_files(resumed, read_manifest(resumed), hash_bytes=1 << 40)  # checksums of both runs' groups hold
    assert {p.name: p.stat().st_mtime_ns for p in resumed.glob("part-0-*")} == first  # group 0 not rewritten
    assert not list(resumed.glob(".*"))  # no progress records left behind
    prepare_olmo(tmp_path / "docs", tmp_path / "resumed", *settings)  # up to date: reused, nothing rewritten
    assert {p.name: p.stat().st_mtime_ns for p in resumed.glob("part-0-*")} == first
