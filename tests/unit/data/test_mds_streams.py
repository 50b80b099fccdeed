"""MDS through mosaicml-streaming (data/mds.py): the package works with the project's numpy 2 (it declares numpy<2.2
and is installed with --no-deps, Makefile "MDS"), our writer's folders read back row for row, the authors' per-folder
proportions hold in an epoch, the collator keeps documents apart, and a bad folder is one clear error before any work.
"""

import json

import numpy as np
import pytest
import torch

from instella_recipes.core import RecipeError
from instella_recipes.data import mds


def _docs(n: int, first_id: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(range(first_id, first_id + int(rng.integers(3, 12)))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    path.write_text('{"model": "stand-in"}\n')
    return path


@pytest.fixture(scope="module")
def two_folders(tmp_path_factory, tokenizer_file):
    root = tmp_path_factory.mktemp("mds")
    mds.write_mds(root / "a", mds.pack_rows(_docs(300, 2), 16), tokenizer_file)
    mds.write_mds(root / "b", mds.pack_rows(_docs(300, 200, seed=1), 16), tokenizer_file)
    return root


def test_streaming_imports_with_numpy_2_and_reads_back_what_our_writer_wrote(tmp_path, tokenizer_file):
    streaming = mds.import_streaming()
    assert int(np.__version__.split(".")[0]) >= 2 and streaming.__version__ == "0.13.0"
    rows = list(mds.pack_rows(_docs(40, 2), 16))
    rows = [{**row, "label_mask": (np.arange(16) % 3 > 0).astype(np.uint8)} for row in rows]
    assert mds.write_mds(tmp_path / "rt", iter(rows), tokenizer_file) == len(rows)
    index = json.loads((tmp_path / "rt" / "index.json").read_text())
    assert index["shards"][0]["column_names"] == ["indices", "input_ids", "label_mask"]
    back = streaming.LocalDataset(str(tmp_path / "rt"))
    assert len(back) == len(rows)
    for i, row in enumerate(rows):
        for key in ("input_ids", "indices", "label_mask"):
            np.testing.assert_array_equal(back[i][key].reshape(row[key].shape), row[key])
    record = json.loads((tmp_path / "rt" / mds.TOKENIZER_RECORD).read_text())
    assert record["tokenizer_sha256"] == mds.tokenizer_digest(tokenizer_file) and record["rows"] == len(rows)


def test_an_epoch_keeps_the_authors_proportions_and_is_the_same_on_a_second_build(two_folders, tokenizer_file):
    streams = mds.check_mds_streams(
        [f"{two_folders}/a@0.75", f"{two_folders}/b@0.25"], None, mds.tokenizer_digest(tokenizer_file)
    )
    orders = []
    for _ in range(2):  # a resumed process builds it anew: streaming's epoch 0 must be the same rows in order
        rows = mds.MDSRows(streams, 16, True, 6198, 4, 80, 1)
        orders.append([int(item["input_ids"][0]) for item in rows.dataset])
        del rows
    assert orders[0] == orders[1] and len(orders[0]) == 80
    from_a = sum(first < 200 for first in orders[0])
    assert from_a == 60  # 0.75 x 80: streaming samples each stream's share of the epoch exactly


def test_the_collator_restarts_positions_per_document_and_masks_targets():
    item = {
        "input_ids": np.arange(10, 20, dtype=np.uint32),
        "indices": np.array([[0, 3], [3, 8], [8, 10]], dtype=np.uint32),
        "label_mask": np.array([0, 0, 1, 1, 1, 1, 1, 1, 1, 1], dtype=np.uint8),
    }
    batch = mds.MDSCollator(8, document_masking=True)([item])
    assert batch["input_ids"].tolist() == [list(range(10, 18))]  # truncated at seq_len (per_device_max_tokens)
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 4]]
    assert batch["labels"].tolist() == [[-100, -100, 12, 13, 14, 15, 16, 17]]
    whole = mds.MDSCollator(10, document_masking=True)([{"input_ids": item["input_ids"]}])  # no indices: one doc
    assert torch.equal(whole["position_ids"][0], torch.arange(10))


def test_bad_folders_are_one_clear_error(two_folders, tmp_path, tokenizer_file):
    with pytest.raises(RecipeError, match="is not a folder"):
        mds.check_mds_streams([f"{tmp_path}/missing@1.0"], None, None)
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "shard.00000.mds").write_bytes(b"x")
    with pytest.raises(RecipeError, match="has no index.json"):
        mds.check_mds_streams([f"{tmp_path}/half@1.0"], None, None)
    other = tmp_path / "other.json"
    other.write_text('{"model": "another"}\n')
    with pytest.raises(RecipeError, match="was tokenised with another tokenizer"):
        mds.check_mds_streams([f"{two_folders}/a@1.0"], None, mds.tokenizer_digest(other))
    with pytest.raises(RecipeError, match="proportion after '@' is not a number"):
        mds.parse_streams(["a@x"])
    with pytest.raises(RecipeError, match="every folder a proportion"):
        mds.parse_streams(["a@0.5", "b"])
    with pytest.raises(RecipeError, match="already holds an MDS index"):
        mds.write_mds(two_folders / "a", mds.pack_rows(_docs(40, 2), 16), tokenizer_file)


def test_the_authors_loader_and_collator_give_the_same_rows_in_the_same_order(two_folders):
    """Their `build_streaming_dataset` + `StreamingDataCollator` (tests/helpers/instella_mds_oracle.py, verbatim) and
    ours over the same folders, micro-batch 1 as their configs: the same rows in the same order, the same tokens,
    and our per-document positions restart exactly at their `doc_lens` borders."""
    from types import SimpleNamespace

    from tests.helpers import instella_mds_oracle as theirs

    paths = [f"{two_folders}/a@0.75", f"{two_folders}/b@0.25"]
    config = SimpleNamespace(
        max_duration=10, global_train_batch_size=8, seq_parallel_size=1, device_train_batch_size=1, seed=6198,
        epoch=0, data=SimpleNamespace(num_workers=1),
    )  # fmt: skip
    their_dataset = theirs.build_streaming_dataset(paths, config)
    their_rows = list(their_dataset)
    del their_dataset
    ours = mds.MDSRows(mds.parse_streams(paths), 12, True, 6198, 1, 80, 1)
    our_rows = list(ours.dataset)
    assert len(our_rows) == len(their_rows) == 80
    their_collator, our_collator = theirs.StreamingDataCollator(per_device_max_tokens=12), ours.collator
    for mine, their in zip(our_rows, their_rows):
        np.testing.assert_array_equal(mine["input_ids"], their["input_ids"])
        a, b = our_collator([mine]), their_collator([their])
        assert torch.equal(a["input_ids"], b["input_ids"])
        starts = (a["position_ids"][0] == 0).nonzero().flatten().tolist() + [a["input_ids"].shape[1]]
        lengths = [end - start for start, end in zip(starts, starts[1:])]
        assert lengths == [n for n in b["doc_lens"][0].tolist() if n > 0]


def test_packed_rows_are_full_and_every_span_is_kept_by_the_authors_collator():
    rows = list(mds.pack_rows(_docs(200, 2, seed=3) + [[7], [8, 9]], 13))
    assert rows
    for row in rows:
        spans = row["indices"].tolist()
        assert len(row["input_ids"]) == 13 and spans[0][0] == 0 and spans[-1][1] == 13
        assert all(b - a >= 2 for a, b in spans) and all(x[1] == y[0] for x, y in zip(spans, spans[1:]))


def test_without_mosaicml_streaming_the_error_names_the_install(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "streaming" else real(name, *a))
    with pytest.raises(RecipeError, match="mosaicml-streaming, which is not installed: install it as the Makefile"):
        mds.import_streaming()


def test_each_source_gets_one_plain_folder_under_output_dir():
    """A source named by its path (the default) gets the file's stem, never a path that nests or leaves output_dir;
    two sources on one folder are refused before any work."""
    from instella_recipes.data.prepare import mds_folder_names
    from instella_recipes.data.sources import SourceSpec

    paths = ["runs/demo/data/long_corpus.jsonl", "/abs/books.jsonl"]
    specs = [*(SourceSpec(path=p, name=p) for p in paths), SourceSpec(path="x.jsonl", name="wiki")]
    assert mds_folder_names(specs) == ["long_corpus", "books", "wiki"]
    with pytest.raises(RecipeError, match="would share the MDS folder 'books'.*distinct 'name'"):
        mds_folder_names([SourceSpec(path="a/books.jsonl", name="a/books.jsonl"), SourceSpec(name="books")])


def test_a_documents_mask_travels_with_its_tokens_across_row_borders():
    """SFT-style documents `(ids, mask)`: each row's `label_mask` is its tokens' own (here the mask is a function of
    the token, so any shift between the two shows), also for a document cut at a row border."""
    docs = [(ids, [t % 2 for t in ids]) for ids in _docs(200, 2, seed=4)]
    rows = list(mds.pack_rows(docs, 13))
    assert len(rows) > 10
    for row in rows:
        np.testing.assert_array_equal(row["label_mask"], row["input_ids"] % 2)
    assert "label_mask" not in next(mds.pack_rows(_docs(20, 2), 13))


def test_label_mask_after_is_for_layout_mds_only():
    from instella_recipes.data.prepare import PrepareArguments

    for layout, marker in (("packed", "Answer:"), ("mds", "")):
        with pytest.raises(RecipeError, match="label_mask_after: a non-empty text, for layout mds only"):
            PrepareArguments(output_dir="out", layout=layout, label_mask_after=marker)


def test_the_shuffle_depends_on_num_canonical_nodes_and_unset_is_the_launchs_nodes(two_folders):
    """streaming's order of an epoch depends on `num_canonical_nodes`; unset (the authors') it is the nodes of the
    launch over the replication: one here, so unset and 1 give the same order and 2 another (the long recipes set
    the authors' value so a launch on other nodes reads their order)."""
    streams = mds.parse_streams([f"{two_folders}/a@0.75", f"{two_folders}/b@0.25"])
    orders = {}
    for nodes in (None, 1, 2):
        rows = mds.MDSRows(streams, 16, True, 6198, 1, 40, 1, num_canonical_nodes=nodes)
        orders[nodes] = [int(item["input_ids"][0]) for item in rows.dataset]
        del rows
    assert orders[None] == orders[1] and orders[1] != orders[2]
