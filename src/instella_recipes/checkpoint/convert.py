"""Checkpoint keys between the authors' OLMo training format and the Hub format, one tensor at a time.

Training format (OLMo codebase): `transformer.blocks.{i}.att_proj.weight` stacks q, k, v (in that order) and
`ff_proj.weight` stacks **up, then gate**; the other keys map one to one (SPEC.md 1). Conversion is pure slicing and
concatenation, so a round trip is bit-exact. Both directions are generators that ask for source tensors by name
(`get_tensor`) only when an output needs them, so a converter over safetensors shards holds at most one layer's
fused group in memory.
"""

import json
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from instella_recipes.core import (
    RecipeError,
    atomic_output_dir,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    setup_logging,
)
from instella_recipes.core.checks import check_range
from instella_recipes.weights.safetensors_io import TensorSource, plan_shards, write_shards
from modeling_instella import InstellaConfig

logger = get_logger(__name__)
# What a model folder holds besides weights and config that a converted copy keeps: the tokenizer (and the generation
# defaults), so that the output loads as the input did.
TOKENIZER_COPIES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json",
    "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json", "generation_config.json",
)  # fmt: skip

# One-to-one renames: training key pattern -> Hub key pattern ({i} is the layer index).
_RENAMES = {
    "transformer.wte.weight": "model.embed_tokens.weight",
    "transformer.ln_f.weight": "model.norm.weight",
    "transformer.ff_out.weight": "lm_head.weight",
    "transformer.blocks.{i}.attn_out.weight": "model.layers.{i}.self_attn.o_proj.weight",
    "transformer.blocks.{i}.q_norm.weight": "model.layers.{i}.self_attn.q_norm.weight",
    "transformer.blocks.{i}.k_norm.weight": "model.layers.{i}.self_attn.k_norm.weight",
    "transformer.blocks.{i}.ff_out.weight": "model.layers.{i}.mlp.down_proj.weight",
    "transformer.blocks.{i}.attn_norm.weight": "model.layers.{i}.pre_attention_layernorm.weight",
    "transformer.blocks.{i}.ff_norm.weight": "model.layers.{i}.pre_feedforward_layernorm.weight",
}
# Fused training tensors -> the Hub tensors they stack, in stacking order.
_FUSED = {
    "transformer.blocks.{i}.att_proj.weight": [
        "model.layers.{i}.self_attn.q_proj.weight",
        "model.layers.{i}.self_attn.k_proj.weight",
        "model.layers.{i}.self_attn.v_proj.weight",
    ],
    "transformer.blocks.{i}.ff_proj.weight": [
        "model.layers.{i}.mlp.up_proj.weight",
        "model.layers.{i}.mlp.gate_proj.weight",
    ],
}


def _layer_of(key: str) -> int | None:
    match = re.search(r"\.(?:blocks|layers)\.(\d+)\.", key)
    return int(match.group(1)) if match else None


def _pattern(key: str) -> str:
    return re.sub(r"\.(blocks|layers)\.\d+\.", r".\1.{i}.", key)


def split_sizes(config) -> dict[str, list[int]]:
    """Row counts of each part of the fused tensors: q/k/v of `att_proj`, up/gate of `ff_proj`."""
    head_dim = config.hidden_size // config.num_attention_heads
    q_rows = config.num_attention_heads * head_dim
    kv_rows = config.num_key_value_heads * head_dim
    return {
        "transformer.blocks.{i}.att_proj.weight": [q_rows, kv_rows, kv_rows],
        "transformer.blocks.{i}.ff_proj.weight": [config.intermediate_size, config.intermediate_size],
    }


def training_to_hub(keys: Iterable[str], get_tensor: Callable[[str], torch.Tensor], config) -> Iterator:
    """Yield `(hub_key, tensor)` for every tensor of a training-format checkpoint. Unknown keys are an error."""
    sizes = split_sizes(config)
    for key in keys:
        pattern, layer = _pattern(key), _layer_of(key)
        if pattern in _RENAMES:
            yield _RENAMES[pattern].format(i=layer), get_tensor(key)
        elif pattern in _FUSED:
            tensor = get_tensor(key)
            if tensor.shape[0] != sum(sizes[pattern]):
                raise ValueError(
                    f"{key} has {tensor.shape[0]} rows but the config expects {sum(sizes[pattern])} "
                    f"({' + '.join(map(str, sizes[pattern]))}); pass the config the checkpoint was trained with."
                )
            for name, part in zip(_FUSED[pattern], torch.split(tensor, sizes[pattern], dim=0)):
                yield name.format(i=layer), part.clone()
        else:
            raise ValueError(f"unexpected key in a training-format checkpoint: {key}")


def hub_to_training(keys: Iterable[str], get_tensor: Callable[[str], torch.Tensor], config) -> Iterator:
    """Yield `(training_key, tensor)` for every tensor of a Hub-format checkpoint; fused groups are concatenated."""
    inverse = {hub: train for train, hub in _RENAMES.items()}
    members = {hub: train for train, hubs in _FUSED.items() for hub in hubs}
    emitted = set()
    for key in keys:
        pattern, layer = _pattern(key), _layer_of(key)
        if pattern in inverse:
            yield inverse[pattern].format(i=layer), get_tensor(key)
        elif pattern in members:
            fused = members[pattern]
            if (fused, layer) in emitted:
                continue
            emitted.add((fused, layer))
            parts = [get_tensor(name.format(i=layer)) for name in _FUSED[fused]]
            yield fused.format(i=layer), torch.cat(parts, dim=0)
        else:
            raise ValueError(f"unexpected key in a Hub-format checkpoint: {key}")


def convert_state_dict(state_dict: dict[str, torch.Tensor], config, to: str) -> dict[str, torch.Tensor]:
    """Convert an in-memory state dict; `to` is "hub" or "training"."""
    convert = {"hub": training_to_hub, "training": hub_to_training}[to]
    return dict(convert(list(state_dict), state_dict.__getitem__, config))


DIRECTIONS = ("to-hub", "to-training", "reconfigure")
# config fields `reconfigure` may change: the RoPE of a context extension (Instella-Long: Instruct -> 64K -> 256K)
RECONFIGURABLE = ("rope_theta", "max_position_embeddings")


def same_tensors(keys: Iterable[str], get_tensor: Callable[[str], torch.Tensor], config) -> Iterator:
    """`reconfigure`: the Hub-format tensors as they are (only the config changes)."""
    for key in keys:
        yield key, get_tensor(key)


def load_config(path: Path | None, source: Path) -> InstellaConfig:
    """The Instella config of the conversion: `path`, else the input folder's (or the input file's folder's)
    config.json. A config of another model type (a Llama checkpoint) is refused: the converter knows Instella's
    layout only, and an Instella config written over other weights makes a folder no loader accepts."""
    candidate = path or (source / "config.json" if source.is_dir() else source.parent / "config.json")
    if not candidate.is_file():
        raise RecipeError(
            f"no config found at {candidate}: pass --model_config path/to/config.json (the model's shape)"
        )
    try:
        model_type = json.loads(candidate.read_text()).get("model_type")
    except (ValueError, AttributeError) as err:
        raise RecipeError(f"{candidate}: not a JSON model config ({err})") from None
    if model_type not in (None, InstellaConfig.model_type):
        raise RecipeError(
            f"{candidate}: model_type '{model_type}', but this converter handles Instella checkpoints only "
            f"(model_type '{InstellaConfig.model_type}'); a {model_type} model's RoPE is changed in its own config"
        )
    return InstellaConfig.from_pretrained(candidate)


def copy_tokenizer(source: Path, folder: Path) -> list[str]:
    """The tokenizer files (`TOKENIZER_COPIES`) of the input folder copied into `folder`; returns their names."""
    names = [name for name in TOKENIZER_COPIES if (source / name).is_file()] if source.is_dir() else []
    for name in names:
        shutil.copy2(source / name, folder / name)
    return names


def convert_checkpoint(
    direction: str, source_path, output, config_path=None, max_shard_size="5GB", overwrite: bool = False,
    config_changes: dict | None = None,
) -> int:  # fmt: skip
    """Convert `source_path` into the folder `output` (written aside, then renamed), tensor by tensor; the shard plan
    comes from a first pass over meta tensors, so a bad checkpoint fails before anything is written. A complete stage
    output at `output` is replaced only with `overwrite`, and never the input. `config_changes` (fields of
    `RECONFIGURABLE`) are set in the written config: `reconfigure` copies a Hub checkpoint with a new RoPE (Instella-
    Long's start point). Returns the number of tensors written."""
    source_path, output = Path(source_path), Path(output)
    if not source_path.exists():
        raise RecipeError(f"--input {source_path} does not exist: give the checkpoint file or folder to convert")
    config = load_config(Path(config_path) if config_path else None, source_path)
    for key, value in (config_changes or {}).items():
        if key == "rope_theta":  # transformers 5 keeps it in rope_parameters; to_dict writes the legacy key too
            config.rope_parameters = {**(config.rope_parameters or {"rope_type": "default"}), "rope_theta": value}
        else:
            setattr(config, key, value)
    source = TensorSource(source_path)
    stream = {"to-hub": training_to_hub, "to-training": hub_to_training, "reconfigure": same_tensors}[direction]
    try:
        plan = plan_shards(dict(stream(source.keys(), source.meta, config)), max_shard_size)
    except ValueError as err:
        raise RecipeError(f"{source_path}: {err}") from None
    with atomic_output_dir(output, overwrite, inputs=[("the input", str(source_path))], what="output") as partial:
        count = write_shards(stream(source.keys(), source, config), partial, plan)
        config.save_pretrained(partial)  # the published auto_map and modeling_instella.py (remote code)
        copied = copy_tokenizer(source_path, Path(partial))
    if not copied:
        logger.warning(f"{source_path} holds no tokenizer files: {output} has none (save one there before loading)")
    return count


@dataclass
class ConvertCheckpointArguments:
    """The settings of `scripts/convert_checkpoint.py` (its first argument, the direction, comes before them)."""

    input: str = field(default=None, metadata={"help": "Checkpoint file or folder of shards."})
    output: str = field(default=None, metadata={"help": "Output folder (written aside, then renamed)."})
    model_config: str | None = field(
        default=None, metadata={"help": "config.json of the model (default: next to the input)."}
    )
    max_shard_size: str = field(default="5GB", metadata={"help": "Largest output shard, e.g. 5GB, 500MB."})
    overwrite: bool = field(default=False, metadata={"help": "Replace a complete stage output at --output."})
    rope_theta: float | None = field(default=None, metadata={"help": "reconfigure: the new RoPE base."})
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "reconfigure: the new context length."}
    )

    def __post_init__(self):
        if not self.input or not self.output:
            raise ValueError("--input and --output are required")
        check_range("rope_theta", self.rope_theta, 1, allow_none=True)
        check_range("max_position_embeddings", self.max_position_embeddings, 1, integer=True, allow_none=True)

    def config_changes(self) -> dict:
        return {k: getattr(self, k) for k in RECONFIGURABLE if getattr(self, k) is not None}


USAGE = f"""convert_checkpoint.py {{{",".join(DIRECTIONS)}}} --input IN --output OUT [options]

    to-hub: the OLMo training format (fused att_proj / ff_proj) -> the Hub format (--model_config: its config.json)
    to-training: the Hub format -> the OLMo training format
    reconfigure: the Hub format -> the Hub format with --rope_theta / --max_position_embeddings changed (a context
        extension's start point, e.g. Instella-3B-Instruct -> Instella-Long phase 1: docs/instella_long.md)
"""


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/convert_checkpoint.py DIRECTION --input IN --output OUT [options]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    direction = argv.pop(0) if argv and argv[0] in DIRECTIONS else None
    if "-h" in argv or "--help" in argv:  # argparse's help lists the flags; the direction comes first, before them
        print(USAGE)
    (args,) = parse_recipe([ConvertCheckpointArguments], argv)  # --help is answered here, before the direction
    setup_logging()
    if direction is None:
        raise RecipeError(f"the first argument is the direction: {' or '.join(DIRECTIONS)}")
    changes = args.config_changes()
    if (direction == "reconfigure") != bool(changes):
        raise RecipeError(
            "reconfigure needs --rope_theta and/or --max_position_embeddings"
            if direction == "reconfigure"
            else f"--rope_theta / --max_position_embeddings are for reconfigure, not {direction}"
        )
    count = convert_checkpoint(
        direction, args.input, args.output, args.model_config, args.max_shard_size, args.overwrite, changes
    )
    sys.stderr.write(f"wrote {count} tensors to {args.output}\n")
    return 0
