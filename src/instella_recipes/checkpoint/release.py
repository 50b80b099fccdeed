"""A stage output becomes a Hub-ready folder: what a Hub model repo holds, written beside the target and renamed
into place (a half-written release never looks like one), `manifest.json` last.

- weights: safetensors shards with their index (`save_pretrained` with `max_shard_size`; a model that fits in one
  shard is still written as `-00001-of-00001` plus an index, so every release has the same layout);
- `config.json` with the `auto_map` and `modeling_instella.py` (remote code: it loads with `trust_remote_code=True`
  where this project is not installed); the tokenizer with the Instella chat template; `generation_config.json`
  (Instella: bos 0, eos 0, pad 1);
- the model card (`huggingface_hub.ModelCard`, its YAML header and model-index from `ModelCardData`/`EvalResult`):
  the recipe, the data mixture, the hyperparameters *as the run resolved them* (recipe + command-line overrides, as
  the stage manifest records them; the recipe file only when the manifest has none, and the card says so), LoRA
  settings, and the evaluation table from lm-eval result JSONs.
"""

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from instella_recipes.core import (
    MANIFEST,
    RecipeError,
    atomic_output_dir,
    check_output_dir,
    exit_on_recipe_error,
    file_digest,
    get_logger,
    parse_recipe,
    read_manifest,
    setup_logging,
    write_manifest,
)
from instella_recipes.core.paths import REPO_ROOT
from instella_recipes.evaluation.results import read_eval_results
from instella_recipes.post_training.dpo import CheckedDPOConfig
from instella_recipes.post_training.sft import CheckedSFTConfig
from instella_recipes.post_training.shared import CheckedModelConfig
from instella_recipes.post_training.template import install_chat_template
from instella_recipes.pretraining.pretrain import PretrainArguments
from instella_recipes.trainer.settings import DATA, RUN, field_roles
from instella_recipes.weights import check_model_folder, check_tokenizer_folder, load_pretrained, looks_like_hub_id
from instella_recipes.weights.safetensors_io import check_model_finite, index_single_file

logger = get_logger(__name__)

DTYPES = ("auto", "bfloat16", "float16", "float32")


@dataclass
class ReleaseArguments:
    model_dir: str = field(metadata={"help": "a stage output (or any HF model folder) to release"})
    output_dir: str = field(metadata={"help": "the Hub-ready folder to write (must not exist unless --overwrite)"})
    model_name: str | None = field(default=None, metadata={"help": "card title (default: the folder name)"})
    max_shard_size: str = field(default="5GB", metadata={"help": "safetensors shard size, e.g. 5GB, 500MB"})
    dtype: str = field(default="auto", metadata={"help": "auto (as saved), bfloat16, float16 or float32"})
    recipe: str | None = field(default=None, metadata={"help": "the recipe YAML (default: from the manifest)"})
    eval_results: list[str] = field(
        default_factory=list, metadata={"help": "lm-eval result JSON files or folders for the model card table"}
    )
    chat_template: str | None = field(
        default=None, metadata={"help": "jinja file; default: keep the tokenizer's, else the Instella template"}
    )
    license: str = field(default="apache-2.0", metadata={"help": "license field of the model card"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing output_dir"})
    push_to_hub: bool = field(default=False, metadata={"help": "upload the folder with huggingface_hub"})
    repo_id: str | None = field(default=None, metadata={"help": "Hub repo for --push_to_hub (org/name)"})
    private: bool = field(default=False, metadata={"help": "create the Hub repo as private"})


def check_arguments(args: ReleaseArguments) -> None:
    """Every input exists and every choice is valid, before anything is loaded or written."""
    check_model_folder(args.model_dir, "model_dir")
    check_tokenizer_folder(args.model_dir, "model_dir")
    check_output_dir(args.output_dir, args.overwrite, inputs=_inputs(args))
    if Path(args.output_dir).exists() and not args.overwrite:
        raise RecipeError(f"output_dir {args.output_dir} exists; choose another folder or pass --overwrite")
    if args.dtype not in DTYPES:
        raise RecipeError(f"dtype must be one of {', '.join(DTYPES)}, not '{args.dtype}'")
    if args.push_to_hub and not args.repo_id:
        raise RecipeError("--push_to_hub needs --repo_id org/name")
    for path in (args.recipe, args.chat_template):
        if path and not Path(path).is_file():
            raise RecipeError(f"{path} does not exist")


def _inputs(args: ReleaseArguments) -> list[tuple[str, str]]:
    """What a release reads, which its output must not replace (release into its own model_dir would delete that
    folder's trainer state, data report and logs)."""
    return [("model_dir", args.model_dir), *(("eval_results", path) for path in args.eval_results)]


# --- reading what made the model ---------------------------------------------------------------------------------
def lineage(model_dir: Path, limit: int = 12) -> list[tuple[Path, dict]]:
    """The stage outputs that led to `model_dir`, newest first: each manifest, then the manifests of the folders it
    names (its inputs), breadth first. Stage manifests name their inputs as paths; we follow any that exist."""
    out, queue, seen = [], [model_dir], set()
    while queue and len(out) < limit:
        folder = queue.pop(0).resolve()
        manifest = read_manifest(folder)
        if folder in seen or manifest is None:
            continue
        seen.add(folder)
        out.append((folder, manifest))
        queue += [Path(p) for p in _strings(manifest) if (Path(p) / MANIFEST).is_file()]
    return out


def _strings(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


def find_recipe(manifest: dict | None) -> str | None:
    """The recipe YAML a manifest records (under `recipe`, `config` or `recipe_path`), if the file exists: as
    recorded (relative to where the run started), or from the repository root (`recipes/...`, the documented way)."""
    for key in ("recipe", "config", "recipe_path"):
        value = (manifest or {}).get(key)
        if isinstance(value, dict):
            value = value.get("path")
        if isinstance(value, str) and value.endswith((".yaml", ".yml")):
            for path in (Path(value), REPO_ROOT / value):
                if path.is_file():
                    return str(path)
    return None


# The settings classes of the training stages: a recipe file read without a manifest is read through their fields'
# roles (`trainer/settings.py`), as the stages themselves record them.
STAGE_SETTINGS = {
    "pretrain": (PretrainArguments,),
    "sft": (CheckedSFTConfig, CheckedModelConfig),
    "dpo": (CheckedDPOConfig, CheckedModelConfig),
}


def _names_with_role(role: str, stage: str | None) -> set[str]:
    """The settings fields with `role` of `stage` (of every training stage when it is not known)."""
    groups = [STAGE_SETTINGS[stage]] if stage in STAGE_SETTINGS else list(STAGE_SETTINGS.values())
    return {name for classes in groups for name, r in field_roles(*classes).items() if r == role}


def resolved_hyperparameters(manifest: dict | None, recipe_data: dict) -> tuple[dict, str]:
    """The hyperparameters the run used and where they come from: the manifest's `hyperparameters` (every field of
    the stage's settings whose role is `run`, as the run resolved it: recipe + command-line overrides; in an older
    manifest its resolved `arguments` with that role), else the recipe file's keys with that role."""
    manifest = manifest or {}
    if isinstance(manifest.get("hyperparameters"), dict):
        return dict(manifest["hyperparameters"]), "as the run resolved them (recipe + overrides)"
    names = _names_with_role(RUN, manifest.get("stage"))
    arguments = manifest.get("arguments")
    if isinstance(arguments, dict):  # a manifest written before `hyperparameters` was: its resolved arguments
        flat = {k: v for group in arguments.values() if isinstance(group, dict) for k, v in group.items()}
        return {k: v for k, v in flat.items() if k in names}, "as the run resolved them (recipe + overrides)"
    return {k: v for k, v in recipe_data.items() if k in names}, "from the recipe file"


def resolved_datasets(manifest: dict | None, recipe_data: dict) -> dict:
    """What the run trained on: the manifest's `datasets` (the settings fields whose role is `data`), else the
    recipe file's keys with that role or naming datasets."""
    if isinstance((manifest or {}).get("datasets"), dict):
        return {k: v for k, v in manifest["datasets"].items() if v not in (None, [], "")}
    names = _names_with_role(DATA, (manifest or {}).get("stage"))
    # and a recipe written for another tool names its data after datasets (alignment-handbook's `dataset_mixture`)
    return {k: v for k, v in recipe_data.items() if k in names or "dataset" in k}


def dataset_ids(datasets) -> list[str]:
    """The dataset names for the card's `datasets` metadata: each source's Hub id or path (`path`, `dataset`,
    `name`, or the source kind such as `{tiny_world: {}}`), each data folder or file list as given; nested
    mixtures (`{datasets: [...]}`) are walked."""
    out = []

    def walk(value) -> None:
        if isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            named = value.get("path") or value.get("dataset") or value.get("name")
            kinds = [key for key, setting in value.items() if isinstance(setting, dict)]
            if isinstance(named, str):
                walk(named)
            elif kinds:  # a generated source: {tiny_world: {...}, split: sft}
                walk(kinds[0])
            else:
                walk(list(value.values()))
        elif isinstance(value, str) and value not in out:
            out.append(value)

    walk(list(datasets.values()))
    return out


def hub_id(value) -> str | None:
    """`value` when it names a Hub repo (`owner/name`, no folder of that name here: `looks_like_hub_id`, and not
    under `runs/`, where every stage of this project writes), else None: the card's metadata takes Hub ids only;
    local paths stay in its body."""
    if isinstance(value, str) and looks_like_hub_id(value) and not value.startswith("runs/"):
        return value
    return None


def given_model(manifest: dict | None) -> str | None:
    """The model a run was trained from, as it was given (a Hub id or a path)."""
    manifest = manifest or {}
    inputs = manifest.get("inputs")  # a training stage's {"model": ...}; a merge lists its input folders
    hyperparameters = manifest.get("hyperparameters")
    given = (inputs.get("model") if isinstance(inputs, dict) else None) or (
        hyperparameters.get("model_name_or_path") if isinstance(hyperparameters, dict) else None
    )
    return given if isinstance(given, str) and given else None


def base_model(chain: list[tuple[Path, dict]]) -> str | None:
    """The card's `base_model`: the Hub id the runs that made this model started from, followed through the local
    stage outputs (`lineage`: a DPO run from `runs/x/sft`, itself from `amd/Instella-3B` -> `amd/Instella-3B`);
    None when they started from scratch or from local folders only."""
    return next((hub for _, manifest in chain if (hub := hub_id(given_model(manifest)))), None)


def hub_datasets(chain: list[tuple[Path, dict]], recipe_data: dict) -> list[str]:
    """The card's `datasets`: the Hub ids among the datasets of every run in the chain (newest first; a generated
    source such as `tiny_world` or a local data folder is named in the card's body, not here)."""
    found = []
    for index, (_, manifest) in enumerate(chain or [(None, None)]):
        names = dataset_ids(resolved_datasets(manifest, recipe_data if index == 0 else {}))
        found += [name for name in names if hub_id(name) and name not in found]
    return found


# --- the model card ------------------------------------------------------------------------------------------------
def _yaml_block(data) -> str:
    return "```yaml\n" + yaml.safe_dump(data, sort_keys=False, default_flow_style=False).strip() + "\n```\n"


def card_data(args: ReleaseArguments, model_type: str, evals: list[dict], chain=(), recipe_data=None) -> ModelCardData:
    """The card's YAML header in the Hub's layout: library, license, tags, `base_model` and `datasets` (Hub ids the
    stage manifests' chain records: `base_model`, `hub_datasets`; nothing when there is none) and the model-index of
    the evaluation rows."""
    results = [
        EvalResult(
            task_type="text-generation",
            dataset_type=row["task"],
            dataset_name=row["task"],
            metric_type=row["metric"],
            metric_value=round(float(row["value"]), 4),
        )
        for row in evals
    ]
    return ModelCardData(
        model_name=args.model_name or Path(args.output_dir).name,
        library_name="transformers",
        pipeline_tag="text-generation",
        license=args.license,
        tags=sorted({model_type, "recipes"}),
        base_model=base_model(list(chain)),
        datasets=hub_datasets(list(chain), recipe_data or {}) or None,
        eval_results=results or None,
    )


def _usage(name: str) -> list[str]:
    """The card's "How to use": the folder has remote code (`auto_map`), so both Auto classes get
    `trust_remote_code=True` (without it transformers asks on stdin, and a script with no terminal fails)."""
    return [
        "## How to use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer", "",
        f'checkpoint = "{name}"',
        "tokenizer = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)",
        'model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype="auto", trust_remote_code=True)',
        "",
        'messages = [{"role": "user", "content": "What is the capital of France?"}]',
        "inputs = tokenizer.apply_chat_template(",
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
        ").to(model.device)",
        "output = model.generate(**inputs, max_new_tokens=32, do_sample=False)",
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True))',
        "```", "",
    ]  # fmt: skip


def _recipe_lines(recipe: str | None, chain: list[tuple[Path, dict]]) -> list[str]:
    lines = ["## Recipe", ""]
    if recipe:
        first = Path(recipe).read_text().splitlines()[:1]
        lines += [f"Trained with the recipe `{recipe}`" + (f" ({first[0].lstrip('# ').strip()})." if first else ".")]
    else:
        lines += ["The recipe file was not recorded in the stage manifest (pass --recipe to name it)."]
    if chain:
        lines += ["", "Stages that made this model (newest first, from the output manifests):", ""]
        lines += ["| stage | output | recipe |", "|---|---|---|"]
        lines += [f"| {m.get('stage', '?')} | `{folder.name}` | {find_recipe(m) or '-'} |" for folder, m in chain]
    return lines


def _eval_lines(evals: list[dict], sources: list[str]) -> list[str]:
    lines = ["", "## Evaluation", ""]
    if not evals:
        return lines + ["No evaluation results were given (pass --eval_results with lm-eval output JSONs)."]
    lines += ["| task | metric | n-shot | value | stderr |", "|---|---|---|---|---|"]
    for row in evals:
        stderr = f"{row['stderr']:.4f}" if row["stderr"] is not None else "-"
        shot = row["n_shot"] if row["n_shot"] is not None else "-"
        lines.append(f"| {row['task']} | {row['metric']} | {shot} | {row['value']:.4f} | {stderr} |")
    return lines + ["", "Scores from lm-evaluation-harness result files: " + ", ".join(f"`{p}`" for p in sources)]


def model_card(args: ReleaseArguments, model, recipe: str | None, chain, evals: list[dict]) -> ModelCard:
    """The model card: header from `card_data`, body naming the architecture, recipe, data, the resolved
    hyperparameters, LoRA settings and evaluation table."""
    config = model.config
    name = args.model_name or Path(args.output_dir).name
    manifest = chain[0][1] if chain else None
    recipe_data = yaml.safe_load(Path(recipe).read_text()) if recipe else {}
    params = sum(p.numel() for p in model.parameters())
    lines = [
        f"# {name}",
        "",
        f"A {config.model_type} causal language model with {params:,} parameters "
        f"({config.num_hidden_layers} layers, hidden size {config.hidden_size}, "
        f"{config.num_attention_heads} attention heads, vocabulary {config.vocab_size}), "
        f"released from `{args.model_dir}` by `scripts/release.py`.",
        "",
        *_usage(args.repo_id or name),
        *_recipe_lines(recipe, chain),
    ]
    data = resolved_datasets(manifest, recipe_data)
    lines += ["", "## Data mixture", ""]
    lines += [_yaml_block(data) if data else "Not recorded in the recipe (see the stage recipes above)."]
    hyper, origin = resolved_hyperparameters(manifest, recipe_data)
    lines += ["", "## Hyperparameters", "", f"Values {origin}:", ""]
    lines += [_yaml_block(hyper) if hyper else "Not recorded."]
    if lora := (manifest or {}).get("lora"):
        lines += ["", "## LoRA", "", "Trained as a LoRA adapter (merged into these weights):", "", _yaml_block(lora)]
    lines += _eval_lines(evals, args.eval_results)
    lines += [
        "",
        "## Files",
        "",
        "Weights as safetensors shards with `model.safetensors.index.json`; `config.json` with `auto_map` and the "
        "modeling code (remote code); the tokenizer with its chat template; `generation_config.json` "
        f"(bos {config.bos_token_id}, eos {config.eos_token_id}, pad {config.pad_token_id}).",
        "",
    ]
    header = card_data(args, config.model_type, evals, chain, recipe_data).to_yaml()
    return ModelCard(f"---\n{header}\n---\n\n" + "\n".join(lines))


# --- loading and writing -------------------------------------------------------------------------------------------
def load_for_release(args: ReleaseArguments):
    """The model (with Instella's generation config) and its tokenizer (with a chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    import modeling_instella  # noqa: F401  (registers "instella" with the Auto classes)

    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    model = load_pretrained(AutoModelForCausalLM.from_pretrained, args.model_dir, "model_dir", dtype=dtype)
    check_model_finite(model, f"model_dir {args.model_dir}")  # a NaN tensor must not be published
    config = model.config
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    if args.chat_template:
        tokenizer.chat_template = Path(args.chat_template).read_text()
    elif not getattr(tokenizer, "chat_template", None):
        install_chat_template(tokenizer)
    return model, tokenizer


def release(args: ReleaseArguments) -> Path:
    """Write the release folder (and push it when asked); returns its manifest path."""
    check_arguments(args)
    evals = read_eval_results(args.eval_results)
    model_dir, output = Path(args.model_dir), Path(args.output_dir)
    chain = lineage(model_dir)
    recipe = args.recipe or find_recipe(chain[0][1] if chain else None)
    model, tokenizer = load_for_release(args)
    # an old release is replaced only once the new one is complete; never one of the release's own inputs
    with atomic_output_dir(output, overwrite=args.overwrite, inputs=_inputs(args)) as tmp:
        model.save_pretrained(tmp, max_shard_size=args.max_shard_size)
        index_single_file(tmp)
        tokenizer.save_pretrained(tmp)
        model_card(args, model, recipe, chain, evals).save(tmp / "README.md")
        if recipe:
            shutil.copyfile(recipe, tmp / "training_recipe.yaml")
        shards = sorted(p.name for p in tmp.glob("*.safetensors"))
        write_manifest(  # inside the folder before it is renamed into place: it appears complete or not at all
            tmp,
            "release",
            model_dir=str(model_dir),
            recipe=recipe,
            eval_results=args.eval_results,
            shards={name: file_digest(tmp / name) for name in shards},
        )
    logger.info(f"release: {len(shards)} shard(s) + index, card, tokenizer -> {output}")
    if args.push_to_hub:
        from huggingface_hub import HfApi

        api = HfApi()
        api.create_repo(args.repo_id, private=args.private, exist_ok=True)
        api.upload_folder(
            folder_path=str(output), repo_id=args.repo_id, commit_message=f"Release {output.name}",
            ignore_patterns=[MANIFEST],  # the manifest describes this local folder, not the Hub repo
        )  # fmt: skip
        logger.info(f"pushed to https://huggingface.co/{args.repo_id}")
    return output / MANIFEST


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/release.py`: parse, then `release`; the exit status."""
    (args,) = parse_recipe([ReleaseArguments], argv)
    setup_logging()
    release(args)
    return 0
