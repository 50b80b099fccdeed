"""recipes/instella-3b/pipeline.yaml connects its data: prepare_stage1 -> stage1 and prepare_stage2 -> stage2 run
through the real pipeline graph (the real stage entries, commands, inputs and arguments, the real recipes) at toy
scale: tiny local jsonl files stand in for the Hub sources and a tiny model for the 3B one (`recipe_overrides`), and
no accelerate launch (CPU). Each prepare stage writes its token files and, last, `token_files.txt`; each pretraining
stage reads that list and trains on every file in it. The stage-2 samples are the recipe's (3.23% of dclm, ...; 351
dm_maths files)."""

import hashlib
import json
import random
from pathlib import Path

import numpy as np
import yaml

from instella_recipes.core import read_manifest, verify_files
from instella_recipes.data.token_files import TokenFiles, read_path_list
from instella_recipes.pipeline.cli import main

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "recipes" / "instella-3b" / "pipeline.yaml"
STAGES = ["prepare_stage1", "stage1", "prepare_stage2", "stage2"]
SEQ_LEN = 16
WORDS = "the of a number prime sum graph proof code value model data learns step two seven".split()
TINY = {
    "model_config": {"vocab_size": 50304, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 64},
    "attn_implementation": "sdpa", "seq_len": SEQ_LEN, "global_batch_size": 2, "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 1, "max_steps": 2, "warmup_steps": 1, "torch_compile": False, "bf16": False,
    "dataloader_num_workers": 0, "save_strategy": "no", "logging_steps": 1, "report_to": "none", "use_cpu": True,
    "torch_num_threads": 1,
}  # fmt: skip
# documents per file: enough that each group of a sampled source keeps some (the sample is a seeded hash: fixed)
DOCS = {"dclm": 400, "pes2o": 160, "flan": 20, "python-edu": 20}
CHAT_ROWS = {  # one row in each chat set's own format (chat_text.py)
    "openhermes": {"conversations": [{"from": "human", "value": "What is 2 + 3?"}, {"from": "gpt", "value": "5"}]},
    "webinstructsub": {"question": "What is 2 + 3?", "answer": "It is 5."},
    "messages": {"messages": [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]},
}


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))


def _toy_sources(recipe: Path, raw: Path) -> list[dict]:
    """The recipe's sources with local stand-ins: the same names, destinations, samples and per-source settings."""
    rng = random.Random(recipe.name)
    out = []
    for source in yaml.safe_load(recipe.read_text())["sources"]:
        folder = raw / recipe.stem / source["name"]
        folder.mkdir(parents=True)
        local = {k: v for k, v in source.items() if k not in ("path", "data_files", "revision")}
        if source.get("converter"):
            rows = [CHAT_ROWS[source["converter"]]] * 12
            (folder / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            out.append({**local, "path": str(folder / "rows.jsonl")})
            continue
        # dm_maths: more files than its sample takes, one document each; the others two files
        files, docs = (360, 1) if source["name"] == "dm_maths" else (2, DOCS.get(source["name"], 12))
        for f in range(files):
            lines = [json.dumps({"id": f"{source['name']}-{f}-{i}", "text": _text(rng)}) for i in range(docs)]
            (folder / f"part{f:03d}.jsonl").write_text("\n".join(lines) + "\n")
        out.append({**local, "path": str(folder), "data_files": ["*.jsonl"]})
    return out


def _toy_pipeline(tmp_path: Path) -> Path:
    """The real stage entries of the four data stages, each with its recipe's toy overrides and no accelerate."""
    real = yaml.safe_load(PIPELINE.read_text())
    stages = []
    for entry in real["stages"]:
        if entry["name"] not in STAGES:
            continue
        entry = {k: v for k, v in entry.items() if k != "accelerate_config"}
        if entry["name"].startswith("prepare"):
            recipe = ROOT / entry["recipe"]
            entry["recipe_overrides"] = {"sources": _toy_sources(recipe, tmp_path / "raw"), "num_proc": 1,
                                         "raw_dir": str(tmp_path / "raw" / "converted")}  # fmt: skip
        else:  # stage 2 continues stage 1's model
            keep = entry["name"] == "stage1"
            entry["recipe_overrides"] = {k: v for k, v in TINY.items() if keep or k != "model_config"}
        stages.append(entry)
    assert [s["name"] for s in stages] == STAGES
    path = tmp_path / "pipeline.yaml"
    carried = {"env": real.get("env", {}), "vars": real.get("vars", {})}  # the real pipeline's placeholders
    text = yaml.safe_dump({"output_dir": str(tmp_path / "run"), **carried, "stages": stages})
    path.write_text("# CPU, tiny model, global batch 2 (test)\n" + text)
    return path


def _subsets(lines: list[str]) -> list[str]:
    """The folders of a token-file list in the order they first appear."""
    out = []
    for line in lines:
        folder = line.rsplit("/", 1)[0]
        if folder not in out:
            out.append(folder)
    return out


def _authors_list(name: str) -> list[str]:
    return (ROOT / "recipes" / "instella-3b" / "token_files" / name).read_text().splitlines()


def test_the_pretraining_stages_read_every_file_their_prepare_stage_wrote(tmp_path):
    config = _toy_pipeline(tmp_path)
    argv = ["--config", str(config), *[a for s in ["prepare_stage1", "stage1", "prepare_stage2", "stage2_6198"]
                                       for a in ("--stage", s)]]  # fmt: skip
    assert main(argv) == 0
    run = tmp_path / "run"
    for prepare, stage, authors in [("prepare_stage1", "stage1", "stage1.txt"),
                                    ("prepare_stage2", "stage2_6198", "stage2.txt")]:  # fmt: skip
        folder = run / prepare
        root = read_manifest(folder)
        verify_files(folder, root)  # the list and every source's manifest, as recorded
        listed = (folder / "token_files.txt").read_text().splitlines()
        on_disk = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.npy"))
        assert sorted(listed) == on_disk and listed == root["token_files"] and len(listed) == len(set(listed))
        assert _subsets(listed) == _subsets(_authors_list(authors))  # the authors' subsets, in their order
        for subset in _subsets(listed):  # each source's manifest describes its files with their sizes
            verify_files(folder / subset, read_manifest(folder / subset), hash_bytes=0)

        # the pretraining stage trained on exactly those files (the fingerprint of the files it read, as listed)
        trained = read_manifest(run / stage)
        assert trained["data_paths"] == [str(folder / "token_files.txt")] and trained["global_step"] == 2
        entries, paths = read_path_list(trained["data_paths"], trained["data_root"])
        items = TokenFiles(paths, SEQ_LEN).fingerprint_items(entries)
        assert entries == listed
        assert trained["data_fingerprint"] == hashlib.sha256(json.dumps(items).encode()).hexdigest()

    # stage 2's samples: the authors' stated shares of documents, and 351 dm_maths files (one per sampled input)
    folder = run / "prepare_stage2" / "datasets" / "instella-stage2-mix-tokenized"
    dm_maths = read_manifest(folder / "dm_maths")
    assert dm_maths["num_files"] == 351 and dm_maths["sample"] == {"files": 351, "seed": 0, "of_files": 360}
    for name, share in {"dclm": 0.0323, "flan": 0.5, "pes2o": 0.053, "python-edu": 0.5}.items():
        sample = read_manifest(folder / name)["sample"]
        assert sample["fraction"] == share and 0 < sample["lines_kept"] < sample["lines_read"]
        n = sample["lines_read"]
        assert abs(sample["kept_share_of_lines"] - share) < 4 * np.sqrt(share * (1 - share) / n) + 1 / n, sample
