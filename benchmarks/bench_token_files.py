"""Pretraining readers side by side: OLMo token files in the authors' order (`data_paths`: `TokenFiles` +
`OLMoOrderSampler`) vs prepared packed windows (`data_dir`: `PackedWindows` + the Trainer's random sampler).

Both are read the way training reads them: `PretrainTrainer.get_train_dataloader()` (accelerate's prepared
DataLoader, the collator `scripts/pretrain.py` gives each, the recipe's per-device batch) over the same tokens at
seq 4096, with 0, 1 and 2 dataloader workers. Throughput = instances (samples) per second over a pass of `--batches`
batches after the first (worker start-up excluded); paired repeats in rotating order, the page cache warm for both.
Goal: ours >= 1.0x.

    python benchmarks/bench_token_files.py [--instances 4096 --batches 1000 --repeats 11 --workers 0 1 2]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import TrainingArguments, default_data_collator

import modeling_instella  # noqa: F401
from instella_recipes.data.packing import TOKENS, PackedWindows
from instella_recipes.data.token_files import OLMoOrderSampler, TokenFiles
from instella_recipes.pretraining.pretrain_trainer import PretrainTrainer
from modeling_instella import InstellaConfig, InstellaForCausalLM

SEQ = 4096
VOCAB = 50280


def make_data(folder: Path, instances: int, files: int, seed: int = 0):
    """The same token stream twice: a packed tokens.bin of `instances` windows, and `files` token files of odd
    lengths (each remainder < SEQ, so the two hold the same number of instances give or take the remainders)."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(2, VOCAB, instances * SEQ).astype("<u2")
    packed = folder / "packed"
    packed.mkdir()
    tokens.tofile(packed / TOKENS)
    manifest = {"seq_len": SEQ, "num_windows": instances, "eos_token_id": 0, "dtype": "uint16"}
    cuts = np.sort(rng.choice(np.arange(1, instances * SEQ), files - 1, replace=False))
    paths = []
    for i, part in enumerate(np.split(tokens, cuts)):
        path = folder / f"part-{i:02d}-00000.npy"
        part.tofile(path)
        paths.append(path)
    return PackedWindows(packed, manifest), TokenFiles(paths, SEQ, vocab_limit=VOCAB)


def trainer_loader(dataset, sampler, workers: int, batch: int, out: Path):
    args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=batch, dataloader_num_workers=workers, use_cpu=True,
        report_to="none", dataloader_drop_last=True, seed=6198,
    )  # fmt: skip
    model = InstellaForCausalLM(InstellaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4))  # fmt: skip
    collator = TokenFiles.collate if isinstance(dataset, TokenFiles) else default_data_collator  # as pretrain.py
    trainer = PretrainTrainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                              train_sampler=sampler)  # fmt: skip
    return trainer.get_train_dataloader()


def samples_per_second(loader, batches: int) -> float:
    iterator = iter(loader)
    next(iterator)  # workers started, first batch out
    start = time.perf_counter()
    n = 0
    for _ in range(batches):
        n += next(iterator)["input_ids"].shape[0]
    return n / (time.perf_counter() - start)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=4096, help="4096-token instances (32 MiB per copy)")
    parser.add_argument("--files", type=int, default=7)
    parser.add_argument("--batch", type=int, default=4, help="per-device batch (the Instella recipes: 4)")
    parser.add_argument("--batches", type=int, default=1000, help="timed batches per pass (at most an epoch)")
    parser.add_argument("--repeats", type=int, default=11)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2], help="0: read in the training process")
    parser.add_argument("--no_record", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        packed, ours = make_data(Path(tmp), args.instances, args.files)
        ours.check_ids()
        sampler = OLMoOrderSampler(len(ours), args.batch, args.batch, 1, seed=6198)
        for workers in args.workers:
            loaders = {
                "packed": trainer_loader(packed, None, workers, args.batch, Path(tmp) / "o1"),
                "ours": trainer_loader(ours, sampler, workers, args.batch, Path(tmp) / "o2"),
            }
            speeds = {name: [] for name in loaders}
            for repeat in range(args.repeats):
                for name in ("packed", "ours") if repeat % 2 == 0 else ("ours", "packed"):
                    speeds[name].append(samples_per_second(loaders[name], args.batches))
            ratios = [o / p for o, p in zip(speeds["ours"], speeds["packed"])]
            rows.append((workers, max(speeds["packed"]), max(speeds["ours"]), ratios))
            print(f"workers {workers}: packed {max(speeds['packed']):.0f}/s, ours {max(speeds['ours']):.0f}/s, "
                  f"paired median {statistics.median(ratios):.2f} [{min(ratios):.2f}, {max(ratios):.2f}]")  # fmt: skip
        print(f"{len(ours)} instances in {args.files} token files vs {len(packed)} packed windows")
    body = (
        f"{args.instances} windows of {SEQ} tokens (uint16, {args.instances * SEQ * 2 / 2**20:.0f} MiB) as one packed "
        f"`tokens.bin` and as {args.files} OLMo token files of odd lengths; each read through "
        f"`PretrainTrainer.get_train_dataloader()` (accelerate's DataLoader; packed: `default_data_collator`, ours: "
        f"`TokenFiles.collate`, labels sharing input_ids' tensor) at per-device "
        f"batch {args.batch}, {args.batches} timed batches per pass after the first, {args.repeats} paired repeats in "
        f"rotating order, page cache warm (host load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} "
        f"after, on {os.cpu_count()} cores: other jobs share the machine, hence the spread). Ours checks every "
        f"instance's max id against the vocabulary as it reads; 0 workers reads in the training process (the "
        f"reader's own cost).\n\n"
        "| dataloader workers | packed windows (samples/s, best) | token files, authors' order (samples/s, best) | "
        "ratio ours / packed, paired median [min, max] |\n|---|---|---|---|\n"
    )
    for workers, packed_best, ours_best, ratios in rows:
        body += (
            f"| {workers} | {packed_best:,.0f} | {ours_best:,.0f} | **{statistics.median(ratios):.2f}** "
            f"[{min(ratios):.2f}, {max(ratios):.2f}] |\n"
        )
    body += (
        "\nEither is far above what training consumes: Instella-3B at 50% MFU on one H200 takes ~22,000 tokens/s "
        "(SPEC.md 6), about 5.4 samples of 4096 tokens per second per GPU."
    )
    if not args.no_record:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, `benchmarks` is not on the path
        from benchmarks.results_io import record

        record("token_files", "Pretraining readers: OLMo token files (authors' order) vs packed windows", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
