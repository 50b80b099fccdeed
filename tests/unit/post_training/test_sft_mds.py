"""SFT from MDS folders (`mds_streams`, the authors' Instella-Long SFT data read by mosaicml-streaming), in process:
the rows SFTTrainer trains on are the authors' loader + collator output in their order (tokens, document borders,
targets after `label_mask`), the first batch is streaming's epoch 0 although TRL reads a row when it is built, the
loss is their summed CE over every input token, and bad input is one error line before any work.
The run from prepare_data's folders: tests/e2e/test_sft_mds_run.py."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from instella_recipes.core import parse_recipe
from instella_recipes.data import mds
from instella_recipes.post_training import sft
from instella_recipes.post_training.shared import CheckedModelConfig
from tests.helpers.argv import overriding

pytestmark = pytest.mark.usefixtures("one_thread")
RECIPE = "recipes/tiny/sft_mds.yaml"
ROW, CUT, STEPS = 16, 12, 24  # rows of 16 tokens, cut at max_length 12 as the authors' collator cuts them


def _documents(n: int, seed: int, masked: bool):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        ids = rng.integers(2, 500, int(rng.integers(3, 9))).tolist()
        yield (ids, (rng.random(len(ids)) < 0.5).astype(int).tolist()) if masked else ids


@pytest.fixture(scope="module")
def sft_folders(tmp_path_factory, tiny_model_dir):
    """Two MDS folders written with the tiny model's tokenizer: one with a label_mask (answers-only rows), one
    without (every target trained)."""
    root = tmp_path_factory.mktemp("sft_mds")
    mds.write_mds(root / "qa", mds.pack_rows(_documents(200, 1, True), ROW), tiny_model_dir)
    mds.write_mds(root / "chat", mds.pack_rows(_documents(200, 2, False), ROW), tiny_model_dir)
    return root


def _argv(folders, model_dir, out, *extra):
    """The run's command line; `extra` flags replace the same flags' values (a flag given twice is an error)."""
    return overriding(
        ["--config", RECIPE, "--model_name_or_path", str(model_dir), "--tokenizer_name_or_path", str(model_dir),
         "--output_dir", str(out), "--mds_streams", f"{folders}/qa@0.75", f"{folders}/chat@0.25",
         "--max_length", str(CUT), "--per_device_train_batch_size", "1", "--global_batch_size", "1",
         "--max_steps", str(STEPS)], list(extra),
    )  # fmt: skip


def _their_rows(folders):
    """The authors' `build_streaming_dataset` + `StreamingDataCollator` (tests/helpers/instella_mds_oracle.py), one
    row a micro-batch as their configs, and each batch's targets by their `get_labels`."""
    from tests.helpers import instella_mds_oracle as theirs

    config = SimpleNamespace(
        max_duration=STEPS, global_train_batch_size=1, seq_parallel_size=1, device_train_batch_size=1, seed=6198,
        epoch=0, data=SimpleNamespace(num_workers=1),
    )  # fmt: skip
    dataset = theirs.build_streaming_dataset([f"{folders}/qa@0.75", f"{folders}/chat@0.25"], config)
    collator = theirs.StreamingDataCollator(per_device_max_tokens=CUT)
    batches = [collator([item]) for item in dataset]
    del dataset  # streaming's shared memory: one dataset over these folders at a time
    return [(batch, theirs.get_labels(None, batch)) for batch in batches]


def test_the_rows_are_the_authors_collator_output_in_their_order_and_the_loss_is_theirs(
    sft_folders, tiny_model_dir, tmp_path
):
    theirs = _their_rows(sft_folders)
    assert len(theirs) == STEPS and any("label_mask" in batch for batch, _ in theirs)
    args, model_args = parse_recipe([sft.CheckedSFTConfig, CheckedModelConfig],
                                    _argv(sft_folders, tiny_model_dir, tmp_path / "out"))  # fmt: skip
    trainer, data = sft.build_trainer(args, model_args)  # SFTTrainer has read a row here (TRL's first look)
    ours = list(trainer.get_train_dataloader())
    assert len(ours) == STEPS
    for mine, (batch, targets) in zip(ours, theirs):
        assert torch.equal(mine["input_ids"], batch["input_ids"])
        starts = (mine["position_ids"][0] == 0).nonzero().flatten().tolist() + [mine["input_ids"].shape[1]]
        assert [b - a for a, b in zip(starts, starts[1:])] == [n for n in batch["doc_lens"][0].tolist() if n > 0]
        assert torch.equal(mine["labels"][:, 1:], targets)  # label_mask -> -100, targets across documents kept
    assert (ours[0]["labels"] == -100).any() and (ours[0]["labels"] != -100).any()

    # the loss of a step: their summed CE over the targets / every input token (SP 1)
    batch = ours[0]
    count = trainer._get_num_items_in_batch([batch], torch.device("cpu"))
    loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=count)
    with torch.no_grad():
        logits = trainer.model(input_ids=batch["input_ids"], position_ids=batch["position_ids"]).logits
    summed = F.cross_entropy(logits[0, :-1], theirs[0][1][0], ignore_index=-100, reduction="sum")
    torch.testing.assert_close(loss.detach(), summed / batch["input_ids"].numel(), rtol=1e-5, atol=1e-6)
    assert data.report["rows"] == STEPS and data.report["mds_streams"] == args.mds_streams


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--sources", "{tiny_world: {}, split: sft, converter: messages}"), "set sources (chat data"),
        (("--packing", "true"), "rows are packed already"),
        (("--max_samples", "4"), "max_samples caps a chat mixture"),
        (("--max_length", "13", "--sequence_parallel_size", "2"), "max_length 13 is not divisible by"),
        (("--max_steps", "-1", "--num_train_epochs", "1"), "mds_streams needs max_steps"),
    ],
)
def test_bad_mds_settings_are_one_line_before_any_work(sft_folders, tiny_model_dir, tmp_path, capsys, extra,
                                                       message):  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        sft.main(_argv(sft_folders, tiny_model_dir, tmp_path / "out", *extra))
    assert exc.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_a_missing_folder_and_another_tokenizer_are_one_line(sft_folders, tiny_model_dir, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text('{"model": "another"}\n')
    cases = [
        (_argv(sft_folders, tiny_model_dir, tmp_path / "out", "--tokenizer_name_or_path", str(other)), "another"),
        (_argv(sft_folders, tiny_model_dir, tmp_path / "out", "--mds_streams", f"{tmp_path}/gone@1.0"),
         "is not a folder"),
    ]  # fmt: skip
    for argv, message in cases:
        with pytest.raises(SystemExit) as exc:
            sft.main(argv)
        assert exc.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error")]
        assert len(err) == 1 and err[0].startswith("error: mds_streams: ") and message in err[0], err
    assert not (tmp_path / "out").exists()
