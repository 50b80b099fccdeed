"""Pretraining from MDS folders (`mds_streams`, the authors' Instella-Long data layout read by mosaicml-streaming):
prepare_data's `layout: mds` writes one folder per source, a tiny run trains on their mixture, a run resumed from
its step-2 checkpoint trains steps 3-4 on the same rows as the uninterrupted run (streaming's epoch is rebuilt in the
same order and the Trainer skips the trained batches), and a folder written with another tokenizer, a missing shard
or a halved index stops the run with one error line before any work; a shard lost while training and a resume after
a shard got other tokens stop it with one line and no manifest."""

import json
import shutil
from pathlib import Path

import pytest

from instella_recipes.data import mds
from instella_recipes.data.prepare import PrepareArguments, prepare
from instella_recipes.pretraining.pretrain import main
from tests.helpers.pretrain_utils import pretrain_argv
from tests.helpers.token_file_utils import recorded_steps

SEQ_LEN = 16
RECORD = ["--plugins", "tests.helpers.token_file_utils:record_inputs"]


@pytest.fixture(scope="module")
def mds_world(tmp_path_factory):
    """prepare_data's layout mds: two tiny-world sources, each an MDS folder of 16-token rows, the tokenizer beside."""
    root = tmp_path_factory.mktemp("mds_run")
    sources = [{"tiny_world": {"seed": seed}, "name": name} for name, seed in (("books", 1234), ("code", 99))]
    args = PrepareArguments(output_dir=str(root), layout="mds", sources=sources, train_tokenizer_vocab_size=512,
                            seq_len=SEQ_LEN, seed=6198, num_proc=1)  # fmt: skip
    prepare(args)
    return root


def _rows_of(folder) -> set:
    streaming = mds.import_streaming()
    return {tuple(int(t) for t in row["input_ids"]) for row in streaming.LocalDataset(str(folder))}


def _argv(world, out, max_steps=4, **overrides):
    values = {"seq_len": SEQ_LEN, "tokenizer": world / "tokenizer", "document_masking": "true", **overrides}
    argv = pretrain_argv(None, out, max_steps=max_steps, save_steps=2, **values)
    i = argv.index("--data_dir")
    del argv[i : i + 2]
    return [*argv, "--mds_streams", f"{world}/books@0.75", f"{world}/code@0.25", *RECORD]


def test_a_run_resumed_mid_epoch_trains_on_the_rows_of_the_uninterrupted_one(mds_world, tmp_path):
    full = tmp_path / "full"
    assert main(_argv(mds_world, full)) == 0
    steps = recorded_steps(full, 1, 1)[0]
    assert len(steps) == 4
    books, code = _rows_of(mds_world / "books"), _rows_of(mds_world / "code")
    rows = [tuple(row) for step in steps for row in step[0]]
    assert sum(row in books for row in rows) == 12 and sum(row in code for row in rows) == 4  # 0.75 / 0.25 of 16
    manifest = json.loads((full / "manifest.json").read_text())
    assert manifest["mds_streams"] == [f"{mds_world}/books@0.75", f"{mds_world}/code@0.25"]
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(full / "run.json", resumed / "run.json")
    assert main(_argv(mds_world, resumed)) == 0
    assert recorded_steps(resumed, 1, 1)[0] == steps[2:]


def _one_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: mds_streams: "), err
    return err[0]


def test_a_missing_folder_an_unfinished_one_and_another_tokenizer_are_one_error_before_any_work(
    mds_world, tmp_path, capsys
):
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text('{"model": "another"}\n')
    assert "another tokenizer" in _one_error(capsys, _argv(mds_world, tmp_path / "out", tokenizer=other))
    half = tmp_path / "half"
    half.mkdir()
    (half / "shard.00000.mds").write_bytes(b"x")
    for folder, says in ((tmp_path / "missing", "is not a folder"), (half, "has no index.json")):
        argv = _argv(mds_world, tmp_path / "out")
        i = argv.index("--mds_streams")
        argv[i + 1 : i + 3] = [f"{mds_world}/books@0.75", f"{folder}@0.25"]
        assert says in _one_error(capsys, argv)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_the_ranks_of_a_sequence_parallel_group_read_one_row(mds_world, tmp_path):
    """2 processes over gloo with SP 2 (streaming's `replication`, the authors' scheme): at each step the two ranks'
    chunks join into one row of the folders."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=str(root), OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")  # the plugin
    out = tmp_path / "sp2"
    argv = _argv(mds_world, out, max_steps=2, per_device_train_batch_size=1, global_batch_size=1,
                 sequence_parallel_size=2)  # fmt: skip
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    done = subprocess.run([*launch, "scripts/pretrain.py", *argv], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows_of(mds_world / "books") | _rows_of(mds_world / "code")
    rank0, rank1 = recorded_steps(out, 2, 1)
    assert len(rank0) == len(rank1) == 2
    for first, second in zip(rank0, rank1):
        assert tuple(first[0][0] + second[0][0]) in rows


def _reversed_first_row(folder: Path) -> None:
    """The first row's 16 token ids written in reverse order: other tokens (all within the vocabulary), the same
    size, the same index.json (its recorded checksum dropped first, as in a folder that records none)."""
    index = json.loads((folder / "index.json").read_text())
    index["shards"][0]["raw_data"].pop("hashes", None)
    (folder / "index.json").write_text(json.dumps(index))
    path = folder / index["shards"][0]["raw_data"]["basename"]
    data = bytearray(path.read_bytes())
    begin, end = (int.from_bytes(data[4 * k : 4 * k + 4], "little") for k in (1, 2))  # row 0's offsets
    ids = data[end - 4 * SEQ_LEN : end]  # input_ids are the row's last column (after indices)
    data[end - 4 * SEQ_LEN : end] = b"".join(ids[i : i + 4] for i in range(4 * SEQ_LEN - 4, -4, -4))
    assert begin < end - 4 * SEQ_LEN
    path.write_bytes(bytes(data))


def test_a_resume_after_a_shard_was_rewritten_is_refused_naming_the_shard(mds_world, tmp_path, capsys):
    """The run stopped after its step-2 checkpoint; a shard then got other tokens (same size, same index.json):
    the resume stops with one line naming the shard, and writes no manifest."""
    world = tmp_path / "world"
    for name in ("books", "code", "tokenizer"):
        shutil.copytree(mds_world / name, world / name)
    first = tmp_path / "first"
    assert main(_argv(world, first, max_steps=2)) == 0
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(first / "checkpoint-2", resumed / "checkpoint-2")
    shutil.copy(first / "run.json", resumed / "run.json")
    _reversed_first_row(world / "books")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(_argv(world, resumed, max_steps=2))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds checkpoints of a different run" in err[0], err
    assert f"mds_streams shard {world}/books/shard.00000.mds has other contents" in err[0]
    assert not (resumed / "manifest.json").exists()


def test_a_missing_shard_and_a_halved_index_are_one_error_before_any_work(mds_world, tmp_path, capsys):
    missing, halved = tmp_path / "missing_shard", tmp_path / "halved"
    for folder in (missing, halved):
        shutil.copytree(mds_world / "code", folder)
    (missing / "shard.00000.mds").unlink()
    index = json.loads((halved / "index.json").read_text())
    index["shards"][0]["samples"] //= 2
    (halved / "index.json").write_text(json.dumps(index))
    for folder, says in (
        (missing, "(listed in index.json) is missing"),
        (halved, "rows, the folder was written with"),
    ):
        argv = _argv(mds_world, tmp_path / "out")
        i = argv.index("--mds_streams")
        argv[i + 1 : i + 3] = [f"{mds_world}/books@0.75", f"{folder}@0.25"]
        assert says in _one_error(capsys, argv)
    assert not (tmp_path / "out").exists()


def test_a_shard_lost_while_training_stops_the_run_with_that_error_and_no_manifest(mds_world, tmp_path, capsys):
    """streaming's background thread fails on the lost shard; its error, printed and ignored by streaming, would end
    the epoch with 0 steps and a complete manifest: here it is the run's one error line, exit 2."""
    world = tmp_path / "world"
    for name in ("books", "code", "tokenizer"):
        shutil.copytree(mds_world / name, world / name)
    out = tmp_path / "out"
    argv = _argv(world, out, max_steps=2)
    argv += ["--plugins", "tests.helpers.mds_plugins:drop_shard_at_start", "--plugin_args",
             json.dumps({"drop": str(world / "code" / "shard.00000.mds")})]  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    said = capsys.readouterr().err
    assert "Traceback" not in said, said[-3000:]
    err = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and err[0].startswith(f"error: mds_streams: reading {world}/books, {world}/code failed"), err
    assert not (out / "manifest.json").exists()
