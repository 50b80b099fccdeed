"""Average N checkpoints element-wise (Instella: the three stage-2 seeds), tensor by tensor.

    python scripts/merge.py --inputs A B C --output_dir O [--weights 0.5 0.25 0.25] [--dtype float32]

Each input is an HF folder with safetensors weights. Tensors are read lazily (`safe_open`), one key at a time,
accumulated in fp32 and written per output shard, so memory stays near one model's size plus one tensor per
input. Configs (ignoring bookkeeping fields) and key sets must match. The output folder gets the first input's
config, remote-code files, generation config and tokenizer, then `manifest.json` last.
"""

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from instella_recipes.core import RecipeError, exit_on_recipe_error, parse_recipe, write_manifest

_IGNORED_CONFIG = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures_version"}
_SHARD_BYTES = 5 * 1024**3


@dataclass
class MergeArguments:
    inputs: list[str] = field(default_factory=list, metadata={"help": "Checkpoint folders to average."})
    output_dir: str = field(default=None, metadata={"help": "Folder for the merged model."})
    weights: list[float] | None = field(default=None, metadata={"help": "One weight per input (normalised)."})
    dtype: str | None = field(default=None, metadata={"help": "Output dtype (default: the inputs' dtype)."})


def weight_files(folder: Path) -> dict[str, Path]:
    """Map every tensor key of a checkpoint folder to the safetensors file that holds it."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {k: folder / v for k, v in json.loads(index.read_text())["weight_map"].items()}
    single = folder / "model.safetensors"
    if single.is_file():
        with safe_open(single, "pt") as handle:
            return {k: single for k in handle.keys()}
    raise RecipeError(f"{folder}: no model.safetensors or model.safetensors.index.json (merge needs safetensors)")


def _config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise RecipeError(f"{folder}: no config.json (not an HF model folder)")
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in _IGNORED_CONFIG}


def check_inputs(folders: list[Path]) -> list[dict[str, Path]]:
    if len(folders) < 2:
        raise RecipeError("merge needs at least two --inputs")
    for folder in folders:
        if not folder.is_dir():
            raise RecipeError(f"input {folder} does not exist")
    base = _config(folders[0])
    maps = [weight_files(f) for f in folders]
    for folder, mapping in zip(folders[1:], maps[1:]):
        cfg = _config(folder)
        diff = sorted(k for k in set(base) | set(cfg) if base.get(k) != cfg.get(k))
        if diff:
            raise RecipeError(f"{folder} has a different config than {folders[0]} (fields: {', '.join(diff)})")
        if set(mapping) != set(maps[0]):
            only_a, only_b = sorted(set(maps[0]) - set(mapping)), sorted(set(mapping) - set(maps[0]))
            raise RecipeError(
                f"{folder} and {folders[0]} hold different tensors (only in first: {only_a[:5]}, "
                f"only in {folder.name}: {only_b[:5]})"
            )
    return maps


def merge(inputs: list[str], output_dir: str, weights: list[float] | None = None, dtype: str | None = None) -> Path:
    """Write the weighted element-wise mean of `inputs` to `output_dir`; return it."""
    folders = [Path(p) for p in inputs]
    maps = check_inputs(folders)
    if weights is None:
        weights = [1.0] * len(folders)
    if len(weights) != len(folders) or any(w < 0 for w in weights) or sum(weights) <= 0:
        raise RecipeError(f"--weights needs {len(folders)} non-negative numbers with a positive sum, got {weights}")
    total = float(sum(weights))
    coeffs = [w / total for w in weights]
    out = Path(output_dir)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)

    handles = {}

    def tensor(i: int, key: str) -> torch.Tensor:
        path = maps[i][key]
        if path not in handles:
            handles[path] = safe_open(path, "pt")
        return handles[path].get_tensor(key)

    shard, shard_bytes, weight_map, shards = {}, 0, {}, []

    def flush():
        nonlocal shard, shard_bytes
        if shard:
            name = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, partial / name, metadata={"format": "pt"})
            shards.append(name)
            weight_map.update(dict.fromkeys(shard, name))
            shard, shard_bytes = {}, 0

    for key in tqdm(sorted(maps[0]), desc="merging", unit="tensor"):
        first = tensor(0, key)
        acc = first.to(torch.float32) * coeffs[0]
        for i in range(1, len(folders)):
            other = tensor(i, key)
            if other.shape != first.shape:
                raise RecipeError(f"tensor {key}: shape {tuple(other.shape)} in {folders[i]} vs {tuple(first.shape)}")
            acc.add_(other.to(torch.float32), alpha=coeffs[i])
        out_dtype = getattr(torch, dtype) if dtype else first.dtype
        shard[key] = acc.to(out_dtype).contiguous()
        shard_bytes += shard[key].numel() * shard[key].element_size()
        if shard_bytes >= _SHARD_BYTES:
            flush()
    flush()
    if len(shards) == 1:
        os.replace(partial / shards[0], partial / "model.safetensors")
    else:
        index = {"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}
        (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))

    skip = {"manifest.json", "run.json", "trainer_state.json", "training_args.bin", "model.safetensors"}
    for item in folders[0].iterdir():
        if item.is_file() and item.name not in skip and not item.name.startswith("model-"):
            if not item.name.endswith(".safetensors") and item.name != "model.safetensors.index.json":
                shutil.copy2(item, partial / item.name)
    write_manifest(partial, "merge", inputs=[str(f) for f in folders], weights=coeffs, dtype=dtype)
    if out.exists():
        shutil.rmtree(out)
    os.replace(partial, out)
    print(f"merge: wrote the mean of {len(folders)} checkpoints to {out}")
    return out


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    (args,) = parse_recipe([MergeArguments], argv)
    if not args.output_dir:
        raise RecipeError("set --output_dir")
    if Path(args.output_dir).exists() and any(Path(args.output_dir).iterdir()):
        raise RecipeError(f"output_dir {args.output_dir} exists and is not empty; choose another one")
    merge(args.inputs, args.output_dir, args.weights, args.dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
