"""The token-file reader's contract beside the order (test_token_files_order.py): which files a path list names,
what a token file may be, and the id check that training completes as it reads."""

import numpy as np
import pytest
import torch

from instella_recipes.core import RecipeError
from instella_recipes.data.token_files import (
    SAMPLE_TOKENS,
    TokenFiles,
    TokenIdError,
    check_token_file,
    read_path_list,
)


def _write(path, n, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    np.random.default_rng(seed).integers(0, 500, n).astype("<u2").tofile(path)
    return path


def test_a_list_names_files_under_data_root_verbatim(tmp_path):
    root = tmp_path / "copy"
    a = _write(root / "datasets" / "x" / "part-00-00000.npy", 40)
    b = _write(tmp_path / "elsewhere.npy", 40)
    listing = tmp_path / "paths.txt"
    listing.write_text(f"# the authors' order\ndatasets/x/part-00-00000.npy\n\n  {b}  \n")
    entries, paths = read_path_list(str(listing), str(root))
    assert entries == ["datasets/x/part-00-00000.npy", str(b)] and paths == [a, b]  # absolute entries kept
    assert read_path_list([str(a), str(b)]) == ([str(a), str(b)], [a, b])  # a YAML list, no root


def test_a_missing_file_names_the_line_and_how_many_are_missing(tmp_path):
    listing = tmp_path / "paths.txt"
    _write(tmp_path / "ok.npy", 10)
    listing.write_text("ok.npy\ngone-1.npy\ngone-2.npy\n")
    with pytest.raises(RecipeError, match=r"paths.txt:2: token file .*gone-1.npy does not exist \(1 more of the 3"):
        read_path_list(str(listing), str(tmp_path))
    with pytest.raises(RecipeError, match="names no token file"):
        (tmp_path / "empty.txt").write_text("# nothing\n")
        read_path_list(str(tmp_path / "empty.txt"))


def test_a_numpy_file_with_a_header_is_not_a_token_file(tmp_path):
    np.save(tmp_path / "saved.npy", np.arange(64, dtype=np.uint16))
    with pytest.raises(RecipeError, match="a NumPy .npy file with a header"):
        check_token_file(tmp_path / "saved.npy")


def test_an_id_beyond_the_vocabulary_missed_by_the_start_up_sample_stops_the_read(tmp_path):
    """The start-up check samples head, middle and tail; the reader checks every instance it returns."""
    n = 8 * SAMPLE_TOKENS
    path = _write(tmp_path / "big.npy", n)
    tokens = np.fromfile(path, dtype="<u2")
    tokens[SAMPLE_TOKENS + 5] = 60000  # between the head and middle samples
    tokens.tofile(path)
    dataset = TokenFiles([path], seq_len=64, vocab_limit=512)
    dataset.check_ids()  # the sample does not see it
    bad = (SAMPLE_TOKENS + 5) // 64
    assert torch.equal(
        dataset[bad - 1]["input_ids"], torch.from_numpy(tokens[(bad - 1) * 64 : bad * 64].astype(np.int64))
    )
    with pytest.raises(ValueError, match=rf"big.npy: an id >= the tokenizer's 512 ids .* \(instance {bad}\)"):
        dataset.__getitems__([0, bad])


def test_an_id_beyond_the_vocabulary_read_by_a_dataloader_worker_is_one_line(tmp_path):
    """torch re-raises a worker's exception with the worker's traceback in its message; the error keeps only the
    original line (the entry point prints it as one `error:` line, exit 2)."""
    path = _write(tmp_path / "big.npy", 256)
    tokens = np.fromfile(path, dtype="<u2")
    tokens[70] = 60000
    tokens.tofile(path)
    dataset = TokenFiles([path], seq_len=64, vocab_limit=512)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, num_workers=1, collate_fn=TokenFiles.collate)
    with pytest.raises(TokenIdError) as err:
        next(iter(loader))
    assert isinstance(err.value, RecipeError) and "\n" not in str(err.value)
    assert str(err.value).startswith(f"token file {path}: an id >= the tokenizer's 512 ids in tokens 64..128")


def test_collate_stacks_once_and_labels_are_input_ids(tmp_path):
    path = _write(tmp_path / "a.npy", 200)
    dataset = TokenFiles([path], seq_len=16, document_masking=True)
    batch = TokenFiles.collate(dataset.__getitems__([3, 0, 11]))
    assert batch["input_ids"].shape == (3, 16) and batch["labels"] is batch["input_ids"]
    assert batch["input_ids"].dtype == torch.int64 and batch["position_ids"].shape == (3, 16)
    assert len(dataset) == 12 and torch.equal(batch["input_ids"][2], dataset[11]["input_ids"])
