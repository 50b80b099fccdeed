"""The element-wise mean of N checkpoints (Instella: the three stage-2 seeds), tensor by tensor, bitwise as the
authors' `scripts/merge_ckpts.py` computes it; or a weighted mean.

The uniform mean is the authors' arithmetic (`merge_ckpts.py:41`: Python's `sum` over the state dicts, then `/ n`):
`((0 + t_1) + t_2) + ... + t_n`, each addition rounded in the checkpoints' own dtype, then divided by the integer
count in that dtype; so the result is bitwise theirs for checkpoints in the same dtype (their `model.pt` files are
fp32). Non-uniform `weights` (not in the authors' code) are accumulated in fp32. `dtype` casts the result at the end.
Tensors are read lazily, one key at a time, and written per output shard (huggingface_hub plans the shards), so
memory stays near one shard plus one tensor per input. Configs (ignoring bookkeeping fields) and key
sets must match. The output gets the first input's config, remote-code files, generation config and tokenizer, then
`manifest.json` last, and appears only when complete.
"""

import json
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from instella_recipes.core import (
    RecipeError,
    atomic_output_dir,
    check_replaceable,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    setup_logging,
    write_manifest,
)
from instella_recipes.weights import check_model_folder
from instella_recipes.weights.safetensors_io import TensorSource, plan_shards, weight_files, write_shards

logger = get_logger(__name__)
_IGNORED_CONFIG = {"_name_or_path", "transformers_version", "torch_dtype", "dtype", "architectures_version"}
# Files of an input folder that describe that input, not the merged model.
_NOT_COPIED = {"manifest.json", "run.json", "trainer_state.json", "training_args.bin", "model.safetensors.index.json"}


def _config(folder: Path) -> dict:
    path = check_model_folder(folder, "merge input") / "config.json"
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in _IGNORED_CONFIG}


def check_inputs(folders: list[Path]) -> list[dict[str, Path]]:
    """Every input is a model with the same config (bookkeeping fields aside) and the same tensor names."""
    if len(folders) < 2:
        raise RecipeError("merge needs at least two --inputs")
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


def _coefficients(weights: list[float] | None, n: int) -> list[float] | None:
    """Normalised weights, or None for the uniform mean (no weights, or all equal)."""
    if weights is None:
        return None
    if len(weights) != n or not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise RecipeError(f"--weights needs {n} finite non-negative numbers with a positive sum, got {weights}")
    if len(set(weights)) == 1:
        return None
    return [w / float(sum(weights)) for w in weights]


def _mean(sources: list[TensorSource], coeffs: list[float] | None, keys: list[str], dtype: str | None, folders):
    """(key, mean) for each key, in order; shapes must agree. `coeffs` None: the authors' uniform mean."""
    for key in tqdm(keys, desc="merging", unit="tensor"):
        tensors = [source(key) for source in sources]
        for tensor, folder in zip(tensors[1:], folders[1:]):
            if tensor.shape != tensors[0].shape:
                raise RecipeError(
                    f"tensor {key}: shape {tuple(tensor.shape)} in {folder} vs {tuple(tensors[0].shape)}"
                )
        if coeffs is None:  # merge_ckpts.py:41, operation by operation, in the checkpoints' dtype
            total = 0
            for tensor in tensors:
                total = total + tensor
            merged = total / len(tensors)
        else:
            merged = torch.zeros(tensors[0].shape, dtype=torch.float32)
            for tensor, coeff in zip(tensors, coeffs):
                merged.add_(tensor.to(torch.float32), alpha=coeff)
        yield key, merged.to(getattr(torch, dtype) if dtype else tensors[0].dtype)


def check_dtypes(sources: list[TensorSource], keys: list[str], folders: list[Path], dtype: str | None) -> bool:
    """Whether the inputs hold their tensors in different dtypes (e.g. a float32 and a bfloat16 checkpoint). Then the
    authors' mean (added in the checkpoints' one dtype) is not defined and the output's dtype would be a guess: a
    `RecipeError` unless `dtype` says what the merged model holds (the mean is then taken in float32)."""
    for key in keys:
        dtypes = [source.meta(key).dtype for source in sources]
        if len(set(dtypes)) > 1:
            if dtype is None:
                held = ", ".join(f"{str(d).removeprefix('torch.')} in {f}" for d, f in zip(dtypes, folders))
                raise RecipeError(
                    f"the inputs hold tensors in different dtypes (tensor {key}: {held}): pass --dtype float32 or "
                    f"--dtype bfloat16 to say what the merged model holds (the mean is then taken in float32)"
                )
            return True
    return False


def merge(
    inputs: list[str], output_dir: str, weights=None, dtype: str | None = None, max_shard_size="5GB", overwrite=False
) -> Path:
    """Write the weighted element-wise mean of `inputs` to `output_dir` (a complete output there is replaced only
    with `overwrite`, never one of the inputs); return it."""
    folders = [Path(p) for p in inputs]
    check_inputs(folders)
    coeffs = _coefficients(weights, len(folders))
    sources = [TensorSource(folder) for folder in folders]
    keys = sorted(weight_files(folders[0]))
    if check_dtypes(sources, keys, folders, dtype) and coeffs is None:
        coeffs = [1.0 / len(folders)] * len(folders)  # mixed dtypes: the float32 path, cast to `dtype` at the end
        logger.info(f"merge: the inputs' dtypes differ; the mean is taken in float32 and written as {dtype}")
    out_dtype = getattr(torch, dtype) if dtype else None
    meta = {k: sources[0].meta(k).to(out_dtype) if out_dtype else sources[0].meta(k) for k in keys}
    plan = plan_shards(meta, max_shard_size)
    out = Path(output_dir)
    with atomic_output_dir(out, overwrite, inputs=[("an input", str(f)) for f in folders]) as partial:
        write_shards(_mean(sources, coeffs, keys, dtype, folders), partial, plan)
        for item in folders[0].iterdir():
            if item.is_file() and item.name not in _NOT_COPIED and not item.name.endswith(".safetensors"):
                shutil.copy2(item, partial / item.name)
        uniform = [1.0 / len(folders)] * len(folders)
        write_manifest(partial, "merge", inputs=[str(f) for f in folders], weights=coeffs or uniform, dtype=dtype)
    logger.info(f"merge: wrote the mean of {len(folders)} checkpoints to {out}")
    return out


@dataclass
class MergeArguments:
    """The settings of `scripts/merge.py`."""

    inputs: list[str] = field(default_factory=list, metadata={"help": "Checkpoint folders to average."})
    output_dir: str = field(default=None, metadata={"help": "Folder for the merged model."})
    weights: list[float] | None = field(default=None, metadata={"help": "One weight per input (normalised)."})
    dtype: str | None = field(default=None, metadata={"help": "Output dtype (default: the inputs' dtype)."})
    max_shard_size: str = field(default="5GB", metadata={"help": "Largest output shard, e.g. 5GB, 500MB."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a complete output in output_dir."})


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/merge.py`: parse, check the output folder, merge."""
    (args,) = parse_recipe([MergeArguments], argv)
    setup_logging()
    if not args.output_dir:
        raise RecipeError("set --output_dir")
    check_replaceable(args.output_dir, args.overwrite, inputs=[("an input", path) for path in args.inputs])
    merge(args.inputs, args.output_dir, args.weights, args.dtype, args.max_shard_size, args.overwrite)
    return 0
