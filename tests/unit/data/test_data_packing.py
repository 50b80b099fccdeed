"""Packing is exact (every document's tokens + one EOS, no BOS, in windows; the tail dropped), mixture weights and
repeats give the token counts they promise, and document masking makes a packed row act as separate documents."""

import json

import numpy as np
import pytest
import torch

from instella_recipes.data.packing import PackedWindows, mixture_multipliers, position_ids_for
from instella_recipes.data.prepare import PrepareArguments, prepare
from modeling_instella import InstellaForCausalLM
from tests.conftest import tiny_config


def _write_jsonl(path, texts, key="text"):
    path.write_text("".join(json.dumps({key: t}) + "\n" for t in texts))
    return path


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tiny_tokenizer):
    folder = tmp_path_factory.mktemp("tok")
    tiny_tokenizer.save_pretrained(folder)
    return folder


def _prepare(tmp_path, tokenizer_dir, sources, seq_len=16, **kw):
    args = PrepareArguments(output_dir=str(tmp_path / "out"), sources=sources, tokenizer=str(tokenizer_dir),
                            seq_len=seq_len, seed=3, num_proc=1, **kw)  # fmt: skip
    out = prepare(args)
    manifest = json.loads((out / "manifest.json").read_text())
    return out, manifest, np.fromfile(out / "tokens.bin", dtype=manifest["dtype"]).reshape(-1, seq_len)


def test_windows_hold_every_document_with_one_eos_and_no_bos(tmp_path, tokenizer_dir, tiny_tokenizer):
    texts = [f"The capital of Place{i} is Town{i}." * (1 + i % 3) for i in range(40)]
    src = _write_jsonl(tmp_path / "a.jsonl", texts)
    out, manifest, windows = _prepare(tmp_path, tokenizer_dir, [str(src)])
    docs = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] + [0] for t in texts]
    total = sum(len(d) for d in docs)
    assert manifest["tokens"][str(src)] == {"natural": total, "used": total, "multiplier": 1.0}
    assert manifest["num_windows"] == total // 16 and manifest["dropped_tail_tokens"] == total % 16
    assert manifest["bos_added"] is False and manifest["eos_token_id"] == 0
    flat = windows.reshape(-1).tolist()
    # split the stream at EOS: the complete documents are exactly the encoded texts (in a shuffled order)
    pieces, start = [], 0
    for i, tok in enumerate(flat):
        if tok == 0:
            pieces.append(flat[start : i + 1])
            start = i + 1
    expected = sorted(map(tuple, docs))
    assert all(tuple(p) in set(expected) for p in pieces)
    assert len(pieces) == len(docs) - (1 if total % 16 or flat[-1] != 0 else 0)
    assert flat.count(0) == len(pieces)


def test_second_run_reuses_and_a_changed_input_is_detected(tmp_path, tokenizer_dir, caplog):
    src = _write_jsonl(tmp_path / "a.jsonl", ["one two three four five six seven"] * 20)
    out, manifest, _ = _prepare(tmp_path, tokenizer_dir, [str(src)])
    mtime = (out / "tokens.bin").stat().st_mtime_ns
    with caplog.at_level("INFO", logger="instella_recipes"):
        _prepare(tmp_path, tokenizer_dir, [str(src)])
    assert "reusing" in caplog.text and (out / "tokens.bin").stat().st_mtime_ns == mtime
    _write_jsonl(src, ["something else entirely here"] * 20)
    from instella_recipes.core import RecipeError

    with pytest.raises(RecipeError, match="made from different inputs.*sources"):
        _prepare(tmp_path, tokenizer_dir, [str(src)])
    _, new, _ = _prepare(tmp_path, tokenizer_dir, [str(src)], overwrite=True)
    assert new["fingerprint"] != manifest["fingerprint"]


def test_overwrite_never_replaces_a_folder_that_holds_a_source(tmp_path, tokenizer_dir):
    """--overwrite replaces the output folder, so a source inside it would be deleted: refused before any work."""
    from instella_recipes.core import RecipeError

    (tmp_path / "out").mkdir()
    src = _write_jsonl(tmp_path / "out" / "a.jsonl", ["one two three four five six seven"] * 20)
    with pytest.raises(RecipeError, match="holds source .* path"):
        _prepare(tmp_path, tokenizer_dir, [str(src)], overwrite=True)
    assert src.is_file()


def test_mixture_weights_repeats_and_filters(tmp_path, tokenizer_dir):
    a = _write_jsonl(tmp_path / "a.jsonl", ["alpha beta gamma delta"] * 30)
    rows = [{"text": f"book {i}", "meta": {"set": "Book" if i % 2 else "Web"}} for i in range(40)]
    b = tmp_path / "b.jsonl"
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sources = [
        {"path": str(a), "repeat": 2.5},
        {"path": str(b), "filters": [{"column": "meta.set", "op": "!=", "value": "Book"}]},
    ]
    _, manifest, _ = _prepare(tmp_path, tokenizer_dir, sources)
    ta, tb = manifest["tokens"][str(a)], manifest["tokens"][str(b)]
    per_doc_a = ta["natural"] // 30
    assert ta["used"] == 75 * per_doc_a  # 2 full copies + 15 of 30 documents
    assert tb["used"] == tb["natural"]  # the 20 "Book" rows were dropped before counting
    mult = mixture_multipliers({"x": 100, "y": 900}, {"x": 0.5, "y": 0.5}, {})
    assert mult == {"x": 5.0, "y": pytest.approx(500 / 900)}  # 50/50 of 1000 tokens: x upsampled 5x


def test_position_ids_restart_after_each_eos():
    row = torch.tensor([5, 6, 0, 7, 0, 8, 9, 10])
    assert position_ids_for(row, 0).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_document_masking_gives_the_logits_of_separate_documents(attn):
    torch.manual_seed(0)
    model = InstellaForCausalLM(tiny_config()).eval()
    model.config._attn_implementation = attn
    doc1, doc2 = torch.tensor([11, 12, 13, 0]), torch.tensor([21, 22, 23, 24, 25, 0])
    packed = torch.cat([doc1, doc2])[None]
    with torch.no_grad():
        # use_cache=False, as in training: transformers only derives the document mask when no cache is passed
        positions = position_ids_for(packed[0], 0)[None]
        together = model(input_ids=packed, position_ids=positions, use_cache=False).logits[0]
        alone1 = model(input_ids=doc1[None]).logits[0]
        alone2 = model(input_ids=doc2[None]).logits[0]
        plain = model(input_ids=packed).logits[0]
    torch.testing.assert_close(together, torch.cat([alone1, alone2]), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(plain[4:], alone2, atol=1e-3)  # without masking the second document sees the first


def test_packed_windows_dataset(tmp_path, tokenizer_dir):
    src = _write_jsonl(tmp_path / "a.jsonl", ["a b c d e f g h"] * 30)
    out, manifest, windows = _prepare(tmp_path, tokenizer_dir, [str(src)])
    ds = PackedWindows(out, manifest, document_masking=True)
    item = ds[1]
    assert len(ds) == len(windows) and item["input_ids"].tolist() == windows[1].tolist()
    assert torch.equal(item["labels"], item["input_ids"])
    assert item["position_ids"].tolist() == position_ids_for(item["input_ids"], 0).tolist()


def test_streaming_mode_packs_the_same_tokens(tmp_path, tokenizer_dir, tiny_tokenizer):
    texts = [f"document number {i} says hello" for i in range(60)]
    a = _write_jsonl(tmp_path / "a.jsonl", texts[:30])
    b = _write_jsonl(tmp_path / "b.jsonl", texts[30:])
    sources = [{"path": str(a), "weight": 1}, {"path": str(b), "weight": 1}]
    out, manifest, windows = _prepare(tmp_path, tokenizer_dir, sources, streaming=True, shuffle_buffer=8)
    expected = sum(len(tiny_tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)
    used = sum(v["used"] for v in manifest["tokens"].values())
    assert used == expected  # all_exhausted interleaving of equal-sized sources: every document once
    assert manifest["num_windows"] == expected // 16 == len(windows)


def test_write_shuffled_writes_documents_in_order_across_arrow_chunks(tmp_path):
    """Documents spread over several Arrow chunks, one of them a slice (its offsets do not start at 0), come out in
    exactly the requested order, and the windows are the plain concatenation."""
    import datasets
    import pyarrow as pa

    from instella_recipes.data.packing import WindowWriter, write_shuffled

    docs = [[i] * (i % 5 + 1) + [0] for i in range(1, 40)]
    whole = pa.array(docs, type=pa.list_(pa.int32()))
    column = pa.chunked_array([whole.slice(0, 7), whole.slice(7, 20), whole.slice(27)])
    ds = datasets.Dataset(pa.table({"input_ids": column}))
    assert ds.data.column("input_ids").num_chunks == 3
    order = np.random.default_rng(0).permutation(len(docs))
    writer = WindowWriter(tmp_path / "tokens.bin", seq_len=8, dtype=np.dtype(np.uint16))
    write_shuffled(ds, order, writer, chunk=6)
    writer.close()
    expected = np.concatenate([docs[i] for i in order]).astype(np.uint16)
    n = len(expected) // 8 * 8
    assert np.array_equal(np.fromfile(tmp_path / "tokens.bin", dtype=np.uint16), expected[:n])


def test_tokenize_fn_matches_the_plain_encode(olmo_tokenizer):
    """The tokenize function's column is every document's plain encode + EOS, in order, in the dtype it is given
    (prepare_data passes the packed file's), for empty and non-ASCII documents and an empty batch."""
    import pyarrow as pa

    from instella_recipes.data.packing import make_tokenize_fn

    texts = ["def f(x):\n    return x + 1\n", "The capital of Place7 is Town7.", "", "é ünïcödé 東京 🚀", "a " * 300]
    tokenize = make_tokenize_fn(olmo_tokenizer, eos_id=0, dtype=np.uint16)
    for n in (0, 1, len(texts)):
        out = tokenize(pa.table({"text": pa.array(texts[:n], type=pa.string())}))
        expected = [olmo_tokenizer(t, add_special_tokens=False)["input_ids"] + [0] for t in texts[:n]]
        assert out.column("input_ids").to_pylist() == expected
        assert out.column("num_tokens").to_pylist() == [len(e) for e in expected]
        assert out.schema.field("input_ids").type == pa.list_(pa.uint16())
