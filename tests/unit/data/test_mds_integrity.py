"""MDS folders checked before any work (data/mds_checks.py): each way a folder can disagree with its index.json, a
bad column, token ids past the tokenizer and bad document spans is one `RecipeError` naming the folder, shard (and
row) and what to do; the start-up budget bounds the full reads; a shard lost while streaming reads stops the
iteration with that error (never an epoch that just ends); a refused resume names the changed shard or source."""

import json
import shutil

import numpy as np
import pytest
import torch

from instella_recipes.core import RecipeError
from instella_recipes.data import mds, mds_checks
from instella_recipes.data.sources import source_identities
from instella_recipes.data.token_files import describe_data_change

SEQ = 16


def _rows(n=40, first=2, indices=None):
    for i in range(n):
        ids = np.arange(first + i, first + i + SEQ, dtype=np.uint32)
        yield {"input_ids": ids, "indices": np.asarray(indices or [[0, 8], [8, SEQ]], np.uint32)}


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text('{"model": "stand-in"}\n')
    return path


@pytest.fixture(scope="module")
def good(tmp_path_factory, tokenizer_file):
    folder = tmp_path_factory.mktemp("mds") / "good"
    mds.write_mds(folder, _rows(), tokenizer_file)
    return folder


def _copy(good, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(good, folder)
    return folder, json.loads((folder / "index.json").read_text())


def _shard(folder, index):
    return folder / index["shards"][0]["raw_data"]["basename"]


def _set_index(folder, index):
    (folder / "index.json").write_text(json.dumps(index))


def _missing(folder, index):
    _shard(folder, index).unlink()


def _truncated(folder, index):
    path = _shard(folder, index)
    path.write_bytes(path.read_bytes()[:-10])


def _more_rows(folder, index):  # in a folder without our record (the authors'): the shard's header tells
    (folder / mds.TOKENIZER_RECORD).unlink()
    index["shards"][0]["samples"] += 5
    _set_index(folder, index)


def _halved(folder, index):
    (folder / mds.TOKENIZER_RECORD).unlink()
    index["shards"][0]["samples"] //= 2
    _set_index(folder, index)


def _rewritten(folder, index):  # same size, other bytes in the last row: the recorded xxh3_128 tells
    path = _shard(folder, index)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def _no_shards(folder, index):
    _set_index(folder, {"version": 2, "shards": []})


def _not_json(folder, index):
    (folder / "index.json").write_text("{not json")


def _shard_dropped(folder, index):  # index.json rewritten without its (only) shard's rows: the record tells
    index["shards"][0]["samples"] = 0
    _set_index(folder, index)


BAD_FOLDERS = [
    (_shard_dropped, "lists 0 rows, the folder was written with 40"),
    (_missing, r"shard shard\.00000\.mds \(listed in index\.json\) is missing"),
    (_truncated, r"shard shard\.00000\.mds is \d+ bytes, index\.json says \d+ \(truncated"),
    (_more_rows, "index.json says 45 rows, the shard holds 40"),
    (_halved, "index.json says 20 rows, the shard holds 40"),
    (_rewritten, "does not match its xxh3_128 checksum in index.json"),
    (_no_shards, "lists no shards"),
    (_not_json, "is not a streaming index"),
]


@pytest.mark.parametrize("damage, says", BAD_FOLDERS, ids=[d.__name__ for d, _ in BAD_FOLDERS])
def test_a_folder_that_disagrees_with_its_index_is_one_error_naming_it(good, tmp_path, damage, says):
    folder, index = _copy(good, tmp_path)
    damage(folder, index)
    with pytest.raises(RecipeError, match=says) as info:
        mds.check_mds_data([f"{folder}@1.0"], None, None)
    assert str(folder) in str(info.value) and "\n" not in str(info.value)


BAD_ROWS = [
    ([[0, 8, 16]], r"row 0: indices of shape \[1, 3\] are not \(start, end\) pairs"),
    ([[0, 8], [12, 4]], r"row 0: indices entry 1 \[12, 4\] ends before it starts"),
    ([[0, 8], [8, 20]], r"row 0: indices entry 1 \[8, 20\] ends past the row's 16 tokens"),
    ([[0, 10], [8, 16]], r"row 0: indices entries 0 and 1 overlap or are out of order"),
]


@pytest.mark.parametrize("spans, says", BAD_ROWS, ids=["three_numbers", "reversed", "past_the_end", "overlapping"])
def test_bad_document_spans_are_one_error_naming_the_row_and_the_collator_refuses_them_too(
    tmp_path, tokenizer_file, spans, says
):
    mds.write_mds(tmp_path / "bad", _rows(indices=spans), tokenizer_file)
    with pytest.raises(RecipeError, match=f"{tmp_path / 'bad'}: shard shard.00000.mds {says}"):
        mds.check_mds_data([f"{tmp_path / 'bad'}@1.0"], None, None)
    row = next(_rows(indices=spans))
    with pytest.raises(RecipeError, match=says.partition(": ")[2]):
        mds.MDSCollator(SEQ, document_masking=True)([row])


def test_ids_past_the_tokenizer_and_a_string_column_are_one_error(good, tmp_path):
    with pytest.raises(RecipeError, match=r"row 0: token id 17 is beyond the tokenizer's 10 ids"):
        mds.check_mds_data([f"{good}@1.0"], None, None, vocab_size=10)
    assert mds.check_mds_data([f"{good}@1.0"], None, None, vocab_size=lambda: 100)[0][0][0] == good
    streaming = mds.import_streaming()
    with streaming.MDSWriter(out=str(tmp_path / "str"), columns={"input_ids": "str"}) as writer:
        writer.write({"input_ids": "1 2 3 4"})
    with pytest.raises(RecipeError, match=r"stores input_ids as 'str'; the rows need integer arrays"):
        mds.check_mds_data([f"{tmp_path / 'str'}@1.0"], None, None)


def test_the_start_up_budget_bounds_the_full_reads_and_says_so(good, tmp_path, caplog):
    folder, index = _copy(good, tmp_path)
    _rewritten(folder, index)
    budget = mds_checks.Budget(0)  # over the budget: size and row count only, and one warning
    files = mds_checks.check_shards(folder, index, None, budget)
    budget.warn()
    assert budget.skipped == 1 and "checked by size and row count only" in caplog.text
    shard = _shard(folder, index)
    assert files == [[str(shard), shard.stat().st_size, files[0][2], "mds_streams shard"]]
    index["shards"][0]["samples"] //= 2  # the header is read whatever the budget
    with pytest.raises(RecipeError, match="index.json says 20 rows"):
        mds_checks.check_shards(folder, index, None, mds_checks.Budget(0))


def test_a_shard_lost_while_streaming_reads_stops_the_iteration_with_that_error(good, tmp_path):
    folder, index = _copy(good, tmp_path)
    streams = mds.check_mds_streams([f"{folder}@1.0"], None, None)
    rows = mds.MDSRows(streams, SEQ, True, 0, 4, 40, 1)
    _shard(folder, index).unlink()  # after the start-up checks
    with pytest.raises(RecipeError, match=rf"mds_streams: reading {folder} failed .*shard"):
        list(rows.dataset)


def test_a_changed_shard_or_source_file_is_named_when_a_resume_is_refused(good, tmp_path):
    folder, index = _copy(good, tmp_path)
    _, before = mds.check_mds_data([f"{folder}@1.0"], None, None)
    path = _shard(folder, index)
    data = path.read_bytes()
    path.write_bytes(data[:-40] + bytes(40))  # other tokens in the last row, same size
    index["shards"][0]["raw_data"].pop("hashes")  # a folder that records no checksum: its content identity tells
    (folder / "index.json").write_text(json.dumps(index))
    after = mds_checks.check_shards(folder, index, None, mds_checks.Budget(0))
    assert describe_data_change(before, after) == (
        f"; mds_streams shard {path} has other contents than when the checkpoints were written "
        f"(same size, other bytes)"
    )
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "1 + 1", "answer": "2"}\n')
    first = source_identities([{"path": str(prompts)}, {"tiny_world": {}, "split": "sft"}])
    prompts.write_text('{"prompt": "1 + 1", "answer": "3"}\n')  # rewritten in place, same size
    second = source_identities([{"path": str(prompts)}, {"tiny_world": {}, "split": "sft"}])
    assert len(first) == 1 and describe_data_change(first, second) == (
        f"; sources file {prompts} has other contents than when the checkpoints were written (same size, other bytes)"
    )


def test_past_the_budget_the_collator_refuses_ids_beyond_the_tokenizer():
    row = next(_rows())
    with pytest.raises(RecipeError, match=r"holds token id 17, beyond the tokenizer's 10 ids"):
        mds.MDSCollator(SEQ, document_masking=True, vocab_size=10)([row])
    assert mds.MDSCollator(SEQ, document_masking=True, vocab_size=18)([row])["input_ids"].shape == (1, SEQ)


def test_a_compressed_folder_is_checked_and_keeps_its_identity_once_streaming_decompressed_it(tmp_path):
    streaming = mds.import_streaming()
    folder = tmp_path / "zstd"
    with streaming.MDSWriter(out=str(folder), columns=mds.COLUMNS, compression="zstd", hashes=["sha1"]) as writer:
        for row in _rows():
            writer.write(row)
    streams, before = mds.check_mds_data([f"{folder}@1.0"], None, None, 100)
    assert [entry[0] for entry in before] == [str(folder / "shard.00000.mds.zstd")]
    assert len(list(mds.MDSRows(streams, SEQ, True, 0, 4, 40, 1).dataset)) == 40
    assert (folder / "shard.00000.mds").is_file()  # decompressed beside it by streaming: now both are checked
    assert mds.check_mds_data([f"{folder}@1.0"], None, None, 100)[1] == before
    with pytest.raises(RecipeError, match=r"row 13: token id 30 is beyond the tokenizer.s 30 ids"):
        mds.check_mds_data([f"{folder}@1.0"], None, None, 30)


def test_an_error_from_a_dataloader_worker_stays_one_line():
    """torch re-raises a worker's error as `type(error)(<its traceback as text>)`; ours keeps its own last line."""
    said = "mds_streams: a row of the MDS folders: indices entry 1 [12, 4] ends before it starts"
    worker = mds_checks.MDSDataError(said)
    loader = torch.utils.data.DataLoader(
        [0], batch_size=1, num_workers=1, collate_fn=lambda _: (_ for _ in ()).throw(worker)
    )
    with pytest.raises(mds_checks.MDSDataError) as info:
        next(iter(loader))
    assert str(info.value) == said
