"""Convert Instella checkpoints between the OLMo training format and the Hub format, streaming tensor by tensor.

    python scripts/convert_checkpoint.py to-hub --input olmo_ckpt/ --config config.json --output hf_dir/
    python scripts/convert_checkpoint.py to-training --input hf_dir/ --output olmo_ckpt/

Inputs are a safetensors file or a folder of safetensors shards (a `model.pt` / `.bin` file is read with
`torch.load(mmap=True)`). Tensors are read one at a time and written to shards of at most `--max_shard_size`, so a
3B (or 70B) checkpoint converts in about one shard of memory. The output is written into `<output>.partial` and
renamed when complete, so an interrupted run never leaves a folder that looks finished.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from instella_recipes.checkpoint.convert import hub_to_training, training_to_hub
from instella_recipes.core import RecipeError, exit_on_recipe_error
from modeling_instella import InstellaConfig


class TensorSource:
    """Lazy, name-addressed access to the tensors of a checkpoint file or folder."""

    def __init__(self, path: Path):
        files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path]
        if path.is_dir() and not files:
            files = sorted([*path.glob("*.pt"), *path.glob("*.bin")])
        if not files or not all(f.exists() for f in files):
            raise RecipeError(f"{path}: no checkpoint (want *.safetensors shards, a .safetensors or .pt file)")
        self._where = {}
        self._handles = []
        for file in files:
            if file.suffix == ".safetensors":
                handle = safe_open(str(file), "pt")
                self._handles.append(handle)
                self._where.update({key: handle.get_tensor for key in handle.keys()})
            else:
                state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
                state = state.get("model", state) if isinstance(state, dict) else state
                self._where.update({key: state.__getitem__ for key in state})

    def keys(self) -> list[str]:
        return list(self._where)

    def __call__(self, key: str) -> torch.Tensor:
        return self._where[key](key)


class ShardWriter:
    """Write tensors into numbered safetensors shards plus `model.safetensors.index.json` (the HF layout)."""

    def __init__(self, folder: Path, max_shard_bytes: int):
        self.folder, self.max_shard_bytes = folder, max_shard_bytes
        self.pending, self.pending_bytes, self.shards, self.total_bytes = {}, 0, [], 0

    def add(self, key: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self.pending and self.pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self.pending[key] = tensor.contiguous()
        self.pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        name = f"shard-{len(self.shards):05d}.tmp"
        save_file(self.pending, str(self.folder / name), metadata={"format": "pt"})
        self.shards.append((name, list(self.pending)))
        self.pending, self.pending_bytes = {}, 0

    def close(self) -> None:
        if self.pending:
            self._flush()
        if len(self.shards) == 1:
            (self.folder / self.shards[0][0]).rename(self.folder / "model.safetensors")
            return
        weight_map = {}
        for index, (tmp, keys) in enumerate(self.shards, start=1):
            final = f"model-{index:05d}-of-{len(self.shards):05d}.safetensors"
            (self.folder / tmp).rename(self.folder / final)
            weight_map.update({key: final for key in keys})
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def load_config(path: Path | None, source: Path) -> InstellaConfig:
    candidates = [path] if path else [source / "config.json" if source.is_dir() else source.parent / "config.json"]
    for candidate in candidates:
        if candidate and candidate.is_file():
            return InstellaConfig.from_pretrained(candidate)
    raise RecipeError(f"no config found at {candidates[0]}: pass --config path/to/config.json (the model's shape)")


def convert(direction: str, source_path: Path, output: Path, config_path: Path | None, max_shard_size_gb: float):
    """Convert `source_path` into `output` (written aside, then renamed). Returns the number of tensors written."""
    config = load_config(config_path, source_path)
    source = TensorSource(source_path)
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    writer = ShardWriter(partial, int(max_shard_size_gb * 2**30))
    stream = training_to_hub if direction == "to-hub" else hub_to_training
    count = 0
    try:
        for key, tensor in stream(source.keys(), source, config):
            writer.add(key, tensor)
            count += 1
    except ValueError as err:
        shutil.rmtree(partial)
        raise RecipeError(f"{source_path}: {err}") from None
    writer.close()
    config.save_pretrained(partial)  # writes the published auto_map and copies modeling_instella.py (remote code)
    if output.exists():
        shutil.rmtree(output)
    partial.rename(output)
    return count


@exit_on_recipe_error
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("direction", choices=["to-hub", "to-training"])
    parser.add_argument("--input", type=Path, required=True, help="checkpoint file or folder of shards")
    parser.add_argument("--output", type=Path, required=True, help="output folder")
    parser.add_argument("--config", type=Path, help="config.json of the model (default: next to the input)")
    parser.add_argument("--max_shard_size", type=float, default=5.0, help="GiB per output shard")
    args = parser.parse_args(argv)
    count = convert(args.direction, args.input, args.output, args.config, args.max_shard_size)
    print(f"wrote {count} tensors to {args.output}")


if __name__ == "__main__":
    main()
