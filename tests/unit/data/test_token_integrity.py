"""The token-file content check that scales (`data/integrity.py`): a full hash once, cached by inode, size and times;
sampled blocks on every start; files over the start-up budget named in one warning; `scripts/verify_data.py` to
hash them all; and the resume identity that tells a rewritten file from the one a run started on."""

import json
import os

import numpy as np
import pytest

from instella_recipes.core import RecipeError, write_manifest
from instella_recipes.data import integrity
from instella_recipes.data.integrity import Checked, VerifiedCache, sample_digest, verify_contents
from instella_recipes.data.verify_data import main as verify_data_main


@pytest.fixture
def folder(tmp_path):
    """Three token files of 2.5 MiB (three cached blocks each) under a prepare_data-style manifest."""
    data = tmp_path / "tokens"
    data.mkdir()
    rng = np.random.default_rng(0)
    for g in range(3):
        rng.integers(0, 50000, (5 << 20) // 4, dtype="<u2").tofile(data / f"part-{g}-00000.npy")
    write_manifest(data, "prepare_data", layout="olmo")
    return data


def _items(folder):
    listed = json.loads((folder / "manifest.json").read_text())["integrity"]["files"]
    return [Checked(folder / name, name, entry["xxh3_128"]) for name, entry in listed.items()]


def test_a_flipped_byte_is_found_by_the_full_hash_then_cached_files_are_sampled(folder, tmp_path):
    cache = VerifiedCache(tmp_path / "cache")
    assert verify_contents(_items(folder), cache=cache) == []  # all hashed (within the budget) and cached
    record = cache.get(folder / "part-1-00000.npy")
    assert record is not None and len(record["blocks"]) == 3
    target = folder / "part-1-00000.npy"
    data = bytearray(target.read_bytes())
    data[1_500_000] ^= 0x01
    target.write_bytes(bytes(data))  # a rewrite changes mtime and ctime: no longer cached, hashed again
    assert cache.get(target) is None
    with pytest.raises(RecipeError, match=r"part-1-00000.npy does not match the checksum in the manifest.json"):
        verify_contents(_items(folder), cache=cache)


def test_damage_that_kept_the_files_times_is_found_in_the_sampled_blocks(folder, tmp_path):
    """A disk fault changes no time stamp: the cached block digests are what the start-up check compares with
    (simulated here by a cached digest that no longer matches the bytes)."""
    cache = VerifiedCache(tmp_path / "cache")
    verify_contents(_items(folder), cache=cache)
    path = folder / "part-2-00000.npy"
    record_file = cache._file(path)
    record = json.loads(record_file.read_text())
    record["blocks"][1] = "0" * 16
    record_file.write_text(json.dumps(record))
    with pytest.raises(RecipeError, match=r"part-2-00000.npy does not match the checksum .* \(block 1 of 3\)"):
        verify_contents(_items(folder), cache=cache)
    assert cache.get(path) is None  # dropped: the next start hashes it in full


def test_files_over_the_budget_are_left_to_verify_data_which_fills_the_cache(folder, tmp_path, monkeypatch, caplog):
    cache_dir = tmp_path / "cache_root"
    monkeypatch.setenv("INSTELLA_CACHE_DIR", str(cache_dir))
    left = verify_contents(_items(folder), budget=3 << 20)  # room for one of the three files
    assert len(left) == 2
    integrity.warn_unverified(left, "python scripts/verify_data.py --folders X")
    assert "2 token files (0.0 GiB) were checked by size only" in caplog.text
    assert verify_data_main(["--folders", str(folder), "--workers", "2"]) == 0
    assert verify_contents(_items(folder), budget=0) == []  # every file now cached: sampled blocks only
    (folder / "part-0-00000.npy").write_bytes(b"\0\0" * ((5 << 20) // 4))
    with pytest.raises(SystemExit) as exit_info:
        verify_data_main(["--folders", str(folder)])
    assert exit_info.value.code == 2


def test_the_resume_identity_tells_a_rewritten_file_apart(folder):
    path = folder / "part-0-00000.npy"
    before = sample_digest(path)
    assert sample_digest(path) == before
    tokens = np.fromfile(path, dtype="<u2")
    (tokens[::-1].copy()).tofile(path)  # same size, other tokens
    assert os.path.getsize(path) == tokens.nbytes and sample_digest(path) != before
