"""A pipeline YAML -> an ordered list of stages, each a command line with its inputs and output folder.

The file format (see docs/pipeline.md):

    # <hardware, global batch>          first comment line, like every recipe
    output_dir: runs/demo                # where stage outputs, logs/ and pipeline/ (run records) go
    env: {HF_HUB_OFFLINE: "1"}           # extra environment of every stage
    vars: {steps: 200}                   # values for {placeholders}; `--set steps=20` overrides them
    stages:
      - name: stage1                     # [A-Za-z0-9_]; the output folder defaults to <output_dir>/<name>
        command: scripts/pretrain.py     # a .py entry point (run with this Python), or a program (lm_eval, ...)
        recipe: recipes/tiny/pretrain_stage1.yaml   # passed as --config; its digest is part of the stage identity
        accelerate_config: accelerate_configs/x.yaml   # optional: run through `accelerate launch --config_file`
                                         # (an `lm_eval` stage: `accelerate launch ... -m lm_eval`, data-parallel)
        inputs: [prepare]                # stages whose outputs must be complete first
        args: {data_dir: "{prepare}", output_dir: "{output}"}   # CLI overrides, --key value
      - name: stage2
        matrix: {seed: [5796, 6198, 8915]}   # one stage per value: stage2_5796, ...; {seed} in args
        ...
      - name: merge
        inputs: [stage2]                 # a matrix name stands for all of its stages
        args: {inputs: "{stage2}"}       # ... and expands to their output folders (several arguments)

Placeholders in args, output and env: `{output}` (this stage's folder), `{run}` (the output_dir), `{root}` (the
repository), `{<stage>}` (that stage's output folder), matrix keys, and `vars` (the project's one placeholder
syntax, `instella_recipes.core.variables`). Everything is checked before any stage runs: unknown keys (with
file:line), unknown inputs, cycles, unknown placeholders, missing scripts and recipe files.

`load_pipeline` resolves every stage once, into `stage.resolved` (a `ResolvedStage`: its argv, arguments,
environment, the recipe it runs with `recipe_overrides` merged in, and every path it has under the output_dir). Both
executors (`runner`: here, one stage after another; `slurm`: one sbatch job per stage) read that object and never
render a stage again.
"""

import itertools
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from instella_recipes.core import RecipeError, did_you_mean
from instella_recipes.core.paths import REPO_ROOT as ROOT
from instella_recipes.core.recipe_yaml import load_yaml_text
from instella_recipes.core.variables import PLACEHOLDER, fill_placeholders

NAME = re.compile(r"^[A-Za-z0-9_]+$")
TOP_KEYS = {"output_dir", "env", "vars", "stages", "description", "slurm"}
STAGE_KEYS = {
    "name",
    "description",
    "command",
    "recipe",
    "accelerate_config",
    "inputs",
    "args",
    "output",
    "env",
    "matrix",
    "writes_manifest",
    "recipe_overrides",
    "slurm",
}
# Slurm resources of a stage (`slurm:` at the top = every stage's defaults; a stage's `slurm:` overrides them); used
# only by `--executor slurm` (instella_recipes/pipeline/slurm.py). They do not change a stage's outputs, so they are
# not part of its identity.
SLURM_KEYS = {
    "nodes", "ntasks_per_node", "gpus_per_node", "cpus_per_task", "mem", "time", "partition", "account",
    "preempt_signal_s", "sbatch_args",
}  # fmt: skip


@dataclass(frozen=True)
class ResolvedStage:
    """One stage resolved once, when its pipeline is loaded: what it runs, and where its files are. Both executors
    run exactly this; the run record and the stage identity (`runner.fingerprint`) are made from it."""

    argv: list[str]  # the full command line: entry point (through `accelerate launch`), --config, then `args`
    args: list[str]  # the stage's `args` with every placeholder filled (part of its identity)
    env: dict[str, str]  # the pipeline's `env`, then the stage's (filled): what the stage adds to os.environ
    recipe_file: Path | None  # the `recipe` as found (from the working directory, else the repository)
    recipe_text: str | None  # that recipe with `recipe_overrides` merged in (None: it runs as is)
    recipe_copy: Path | None  # where `recipe_text` is written before the run (and what --config names)
    accelerate_config: Path | None  # the `accelerate_config` as found
    # Every path the stage has under the output_dir, decided here only:
    output: Path  # <output_dir>/<output>: what the stage writes, manifest.json last
    log: Path  # <output_dir>/logs/<name>.log: the stage's output
    record: Path  # <output_dir>/pipeline/<name>.json: the run record
    lock: Path  # <output folder>.lock: held while a run writes the folder
    slurm_log: Path  # <output_dir>/logs/<name>.slurm.log: the batch script's own output (Slurm executor)
    job_record: Path  # <output_dir>/pipeline/<name>.slurm.json: the stage's job id (Slurm executor)


@dataclass
class PipelineStage:
    """One runnable stage (a matrix entry expands to several, sharing `group`)."""

    name: str
    group: str
    command: str
    recipe: str | None = None
    accelerate_config: str | None = None
    inputs: list[str] = field(default_factory=list)
    args: dict | list = field(default_factory=dict)
    output: str = ""
    env: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)  # this entry's matrix values
    recipe_overrides: dict = field(default_factory=dict)  # merged into the recipe -> <run>/pipeline/recipes/
    writes_manifest: bool = True  # False: the command writes no manifest.json, so the pipeline writes it after
    description: str = ""
    where: str = ""  # file:line of its YAML entry, for error messages
    slurm: dict = field(default_factory=dict)  # this stage's Slurm resources, the top-level defaults merged in
    slurm_own: tuple = ()  # the keys its own `slurm:` sets (an evaluation stage's GPUs default to what it uses)
    resolved: ResolvedStage | None = field(default=None, repr=False)  # set once by `load_pipeline`


@dataclass
class Pipeline:
    path: Path
    output_dir: Path
    stages: list[PipelineStage]  # in the order they run
    groups: dict[str, list[str]]  # YAML entry name -> stage names
    env: dict = field(default_factory=dict)
    vars: dict = field(default_factory=dict)
    description: str = ""
    overrides: dict = field(default_factory=dict)  # the `--set VAR=VALUE` given (already applied to `vars`)

    def stage(self, name: str) -> PipelineStage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)

    def select(self, name: str) -> list[PipelineStage]:
        """The stages a `--stage NAME` means: one stage, or all stages of a matrix entry."""
        names = self.groups.get(name) or ([name] if any(s.name == name for s in self.stages) else [])
        if not names:
            known = sorted(set(self.groups) | {s.name for s in self.stages})
            hint = did_you_mean(name, known, "stages: " + ", ".join(known))
            raise RecipeError(f"{self.path}: no stage named '{name}' ({hint})")
        return [self.stage(n) for n in names]

    def output_of(self, stage: PipelineStage) -> Path:
        return self.output_dir / stage.output


def _check_keys(mapping: dict, known: set[str], where: str, what: str) -> None:
    for key in mapping:
        if key not in known:
            hint = did_you_mean(str(key), known, f"known keys: {', '.join(sorted(known))}")
            raise RecipeError(f"{where}: unknown {what} key '{key}' ({hint})")


def _stage_lines(node) -> list[tuple[int, dict[str, int]]]:
    """For each entry of the top-level `stages:` list of the composed document `node`: its line and the line of each
    of its keys."""
    for key, value in node.value if node is not None else []:
        if key.value == "stages" and isinstance(value, yaml.SequenceNode):
            return [
                (item.start_mark.line + 1, {k.value: k.start_mark.line + 1 for k, _ in getattr(item, "value", [])})
                for item in value.value
                if isinstance(item, yaml.MappingNode)
            ]
    return []


def _expand_matrix(entry: dict, where: str) -> list[dict]:
    matrix = entry.get("matrix") or {}
    if not isinstance(matrix, dict) or not all(isinstance(v, list) and v for v in matrix.values()):
        raise RecipeError(f"{where}: matrix must map a key to a non-empty list of values, e.g. {{seed: [1, 2, 3]}}")
    if not matrix:
        return [{}]
    keys = list(matrix)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(matrix[k] for k in keys))]


def _read_yaml(path: Path) -> tuple[dict, list, dict[str, int]]:
    """The pipeline mapping, each stage's (line, key lines), and each top-level key's line; shape checked."""
    if not path.is_file():
        raise RecipeError(f"pipeline file {path} does not exist (pass --config recipes/<model>/pipeline.yaml)")
    data, node = load_yaml_text(path.read_text(), path)  # one parse; duplicate keys refused, as in a recipe
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise RecipeError(f"{path}: a pipeline is a mapping with a non-empty `stages:` list")
    lines = _stage_lines(node)
    top_lines = {k.value: k.start_mark.line + 1 for k, _ in node.value}
    for key in data:
        if key not in TOP_KEYS:
            _check_keys({key: None}, TOP_KEYS, f"{path}:{top_lines.get(key, '?')}", "top-level")
    return data, lines, top_lines


def _variables(path: Path, data: dict, overrides: dict | None) -> dict:
    """The `vars` with the command line's `--set` values (parsed as YAML) applied; unknown names are errors."""
    variables = dict(data.get("vars") or {})
    for key, value in (overrides or {}).items():
        if key not in variables:
            raise RecipeError(f"--set {key}=...: {path} has no var '{key}' (vars: {', '.join(variables) or 'none'})")
        variables[key] = yaml.safe_load(value) if isinstance(value, str) else value
    return variables


def _check_stage_entry(entry, path: Path, line, key_lines: dict, groups: dict) -> str:
    """Checks one `stages:` entry (a mapping with known keys, a name and a command); returns its unique name."""
    where = f"{path}:{line}"
    if not isinstance(entry, dict):
        raise RecipeError(f"{where}: each stage is a mapping with at least `name` and `command`")
    for key in entry:
        if key not in STAGE_KEYS:
            _check_keys({key: None}, STAGE_KEYS, f"{path}:{key_lines.get(key, line)}", "stage")
    for required in ("name", "command"):
        if not entry.get(required):
            raise RecipeError(f"{where}: stage needs a `{required}`")
    group = str(entry["name"])
    if not NAME.match(group) or group in groups:
        raise RecipeError(f"{where}: stage name '{group}' must be unique and use only letters, digits and _")
    return group


def _expand_stage(entry: dict, group: str, where: str, slurm: dict) -> list[PipelineStage]:
    """One Stage per matrix combination of a checked entry (one Stage without a matrix)."""
    stages = []
    for values in _expand_matrix(entry, where):
        name = "_".join([group, *(str(v) for v in values.values())])
        if not NAME.match(name):
            raise RecipeError(f"{where}: matrix values must be letters, digits or _ (stage name '{name}')")
        stages.append(
            PipelineStage(
                name=name,
                group=group,
                command=str(entry["command"]),
                recipe=entry.get("recipe"),
                accelerate_config=entry.get("accelerate_config"),
                inputs=[str(i) for i in entry.get("inputs") or []],
                args=entry.get("args") or {},
                output=str(entry.get("output") or name),
                env={str(k): str(v) for k, v in (entry.get("env") or {}).items()},
                values=values,
                recipe_overrides=entry.get("recipe_overrides") or {},
                writes_manifest=bool(entry.get("writes_manifest", True)),
                description=str(entry.get("description") or ""),
                where=where,
                slurm=dict(slurm),  # one dict per stage: overrides may change one stage only
                slurm_own=tuple(entry.get("slurm") or ()),
            )
        )
    return stages


def _resolve_stages(pipeline: Pipeline) -> None:
    """Substitute every placeholder and check every file now, before anything runs; outputs first (other stages'
    placeholders refer to them), each a distinct folder inside the output_dir. Each stage is then resolved once."""
    for stage in pipeline.stages:
        stage.output = substitute(_values_without_outputs(pipeline, stage), stage, stage.output, "output")
        if not isinstance(stage.output, str) or Path(stage.output).is_absolute() or ".." in Path(stage.output).parts:
            raise RecipeError(f"{stage.where}: output '{stage.output}' must be a folder inside the output_dir")
    outputs = [s.output for s in pipeline.stages]
    if len(set(outputs)) != len(outputs):
        raise RecipeError(f"{pipeline.path}: two stages write the same output folder ({outputs})")
    for stage in pipeline.stages:
        stage.resolved = resolve_stage(pipeline, stage)


def resolve_stage(pipeline: Pipeline, stage: PipelineStage) -> ResolvedStage:
    """The stage's command line, environment, merged recipe and paths (placeholders filled, files found). Called
    once per stage by `load_pipeline`; read `stage.resolved` instead of calling it again."""
    values = placeholder_values(pipeline, stage)
    if stage.recipe_overrides and not stage.recipe:
        raise RecipeError(f"{stage.where}: stage '{stage.name}' has recipe_overrides but no recipe")
    recipe_file = Path(_existing(stage.recipe, stage, "recipe")) if stage.recipe else None
    config = Path(_existing(stage.accelerate_config, stage, "accelerate config")) if stage.accelerate_config else None
    args = _arguments(values, stage)
    output = pipeline.output_of(stage)
    logs, records = pipeline.output_dir / "logs", pipeline.output_dir / "pipeline"
    recipe_copy = records / "recipes" / f"{stage.name}.yaml" if stage.recipe_overrides else None
    return ResolvedStage(
        argv=_command(stage, config, recipe_copy or recipe_file) + args,
        args=args,
        env={**pipeline.env, **{k: substitute(values, stage, v, f"env.{k}") for k, v in stage.env.items()}},
        recipe_file=recipe_file,
        recipe_text=render_recipe(pipeline, stage, values) if recipe_copy else None,
        recipe_copy=recipe_copy,
        accelerate_config=config,
        output=output,
        log=logs / f"{stage.name}.log",
        record=records / f"{stage.name}.json",
        lock=output.with_name(output.name + ".lock"),
        slurm_log=logs / f"{stage.name}.slurm.log",
        job_record=records / f"{stage.name}.slurm.json",
    )


def load_pipeline(path: str | Path, output_dir: str | Path | None = None, overrides: dict | None = None) -> Pipeline:
    """Read and check a pipeline YAML; `output_dir` and `overrides` (for `vars`) come from the command line."""
    path = Path(path)
    data, lines, top_lines = _read_yaml(path)
    variables = _variables(path, data, overrides)
    top_slurm = _slurm_section(data.get("slurm"), f"{path}:{top_lines.get('slurm', '?')}")
    stages, groups = [], {}
    for index, entry in enumerate(data["stages"]):
        line, key_lines = lines[index] if index < len(lines) else ("?", {})
        group = _check_stage_entry(entry, path, line, key_lines, groups)
        slurm = {**top_slurm, **_slurm_section(entry.get("slurm"), f"{path}:{key_lines.get('slurm', line)}")}
        expanded = _expand_stage(entry, group, f"{path}:{line}", slurm)
        groups[group] = [stage.name for stage in expanded]
        stages += expanded
    pipeline = Pipeline(
        path=path,
        output_dir=Path(output_dir or data.get("output_dir") or "runs/pipeline"),
        stages=stages,
        groups={g: n for g, n in groups.items() if n != [g]},
        env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
        vars=variables,
        description=str(data.get("description") or ""),
        overrides={key: variables[key] for key in overrides or {}},
    )
    _resolve_inputs(pipeline, set(groups))
    pipeline.stages = _topological(pipeline)
    _resolve_stages(pipeline)
    return pipeline


def _slurm_section(section, where: str) -> dict:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise RecipeError(f"{where}: `slurm:` must be a mapping, e.g. {{nodes: 16, gpus_per_node: 8, time: 48:00:00}}")
    _check_keys(section, SLURM_KEYS, where, "slurm")
    return dict(section)


def _resolve_inputs(pipeline: Pipeline, entry_names: set[str]) -> None:
    names = {s.name for s in pipeline.stages}
    for stage in pipeline.stages:
        resolved = []
        for name in stage.inputs:
            if name in pipeline.groups:
                resolved += pipeline.groups[name]
            elif name in names:
                resolved.append(name)
            else:
                hint = did_you_mean(name, names | entry_names, "check the stage names")
                raise RecipeError(f"{stage.where}: stage '{stage.name}' has unknown input '{name}' ({hint})")
        if stage.name in resolved:
            raise RecipeError(f"{stage.where}: stage '{stage.name}' lists itself as an input")
        stage.inputs = resolved


def _topological(pipeline: Pipeline) -> list[PipelineStage]:
    """Kahn's algorithm, keeping the YAML order among stages that are ready at the same time."""
    remaining = {s.name: set(s.inputs) for s in pipeline.stages}
    order = []
    while remaining:
        ready = [s for s in pipeline.stages if s.name in remaining and not remaining[s.name]]
        if not ready:
            cycle = ", ".join(sorted(remaining))
            raise RecipeError(f"{pipeline.path}: the stage inputs form a cycle among: {cycle}")
        stage = ready[0]
        order.append(stage)
        del remaining[stage.name]
        for deps in remaining.values():
            deps.discard(stage.name)
    return order


def _values_without_outputs(pipeline: Pipeline, stage: PipelineStage) -> dict:
    """What a stage's `output` may refer to: `vars`, its matrix values, `{run}` and `{root}` (not other folders)."""
    values = {str(k): v for k, v in pipeline.vars.items()}
    values.update({str(k): v for k, v in stage.values.items()})
    values["run"] = str(pipeline.output_dir)
    values["root"] = str(ROOT)  # the repository (for data files of tools run from another directory)
    return values


def placeholder_values(pipeline: Pipeline, stage: PipelineStage) -> dict:
    """Every value a `{name}` in this stage may refer to (lists for matrix names); the stages' outputs resolved."""
    values = {str(k): v for k, v in pipeline.vars.items()}
    for other in pipeline.stages:
        values[other.name] = str(pipeline.output_of(other))
    for group, names in pipeline.groups.items():
        values[group] = [str(pipeline.output_of(pipeline.stage(n))) for n in names]
    values.update(_values_without_outputs(pipeline, stage))
    values["output"] = str(pipeline.output_of(stage))
    return values


def substitute(values: dict, stage: PipelineStage, text, what: str) -> str | list[str] | None:
    """Fill `{placeholders}` from `values` (`placeholder_values`); a value that is exactly one matrix placeholder
    becomes a list of folders, exactly one var set to null becomes None (the argument is left out)."""
    if not isinstance(text, str):
        return str(text) if not isinstance(text, bool) else str(text).lower()
    where = f"{stage.where}: stage '{stage.name}' {what}"
    whole = PLACEHOLDER.fullmatch(text)
    value = values.get(whole.group(1), "") if whole else ""
    if value is None or isinstance(value, list):
        return value
    for name in PLACEHOLDER.findall(text):
        if isinstance(values.get(name), list):
            raise RecipeError(
                f"{where}: {{{name}}} stands for several folders, so it must be the whole value "
                f'(e.g. `inputs: "{{{name}}}"`)'
            )
    return fill_placeholders(text, values, where, otherwise="add it to `vars`")


def _existing(path: str, stage: PipelineStage, what: str) -> str:
    """A script/recipe path as given if it exists from the working directory, else from the repository root."""
    if Path(path).exists():
        return path
    if (ROOT / path).exists():
        return str(ROOT / path)
    raise RecipeError(f"{stage.where}: stage '{stage.name}': {what} {path} does not exist")


def _program(name: str) -> str:
    """`lm_eval`, `accelerate`, ... from this Python's environment first, so a run needs no activated venv."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def _arguments(values: dict, stage: PipelineStage) -> list[str]:
    """The stage's `args` as command-line words (`--key value`, or the list as given), placeholders filled."""
    if isinstance(stage.args, list):
        out = []
        for item in stage.args:
            value = substitute(values, stage, item, "args")
            out += value if isinstance(value, list) else [value]
        return out
    if not isinstance(stage.args, dict):
        raise RecipeError(f"{stage.where}: stage '{stage.name}': args must be a mapping (--key value) or a list")
    out = []
    for key, value in stage.args.items():
        flag = f"--{key}"
        if value is True:  # a bare flag works for argparse store_true and for HfArgumentParser booleans
            out.append(flag)
        elif value is None:
            continue
        elif isinstance(value, list):
            items = []
            for item in value:
                filled = substitute(values, stage, item, f"args.{key}")
                items += filled if isinstance(filled, list) else [filled]
            out += [flag, *items]
        else:
            filled = substitute(values, stage, value, f"args.{key}")
            if filled is not None:
                out += [flag, *filled] if isinstance(filled, list) else [flag, filled]
    return out


def _command(stage: PipelineStage, accelerate_config: Path | None, recipe: Path | None) -> list[str]:
    """The argv before the stage's args: entry point (through accelerate when asked), then `--config recipe`."""
    words = shlex.split(stage.command)
    if words[0].endswith(".py"):
        script = _existing(words[0], stage, "entry point")
        if accelerate_config is not None:
            argv = [_program("accelerate"), "launch", "--config_file", str(accelerate_config), script, *words[1:]]
        else:
            argv = [sys.executable, script, *words[1:]]
    elif words[0] in ("python", "python3"):
        argv = [sys.executable, *words[1:]]
    elif words[0] in ("lm_eval", "lm-eval") and accelerate_config is not None:
        # lm-eval's data-parallel mode (one model per process, its requests split and gathered by lm-eval)
        argv = [_program("accelerate"), "launch", "--config_file", str(accelerate_config), "-m", "lm_eval", *words[1:]]
    else:
        argv = [_program(words[0]), *words[1:]]
    return argv + (["--config", str(recipe)] if recipe is not None else [])


def _merge(base, override):
    if isinstance(base, dict) and isinstance(override, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in override.items()}}
    return override


def _fill(values: dict, stage: PipelineStage, value, what: str):
    if isinstance(value, dict):
        return {k: _fill(values, stage, v, f"{what}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(values, stage, v, what) for v in value]
    if isinstance(value, str):
        filled = substitute(values, stage, value, what)
        return yaml.safe_load(filled) if PLACEHOLDER.fullmatch(value) and isinstance(filled, str) else filled
    return value


def render_recipe(pipeline: Pipeline, stage: PipelineStage, values: dict | None = None) -> str | None:
    """The recipe text a stage runs with `recipe_overrides` merged in (mappings merged key by key, anything else
    replaced; placeholders filled). Its first comment line (hardware, batch) is kept and the origin stated.
    `load_pipeline` calls it once per stage (`stage.resolved.recipe_text`)."""
    if not stage.recipe_overrides:
        return None
    values = placeholder_values(pipeline, stage) if values is None else values
    source = Path(_existing(stage.recipe, stage, "recipe"))
    text = source.read_text()
    base = yaml.safe_load(text) or {}
    merged = _merge(base, _fill(values, stage, stage.recipe_overrides, "recipe_overrides"))
    first = text.splitlines()[0] if text.startswith("#") else "#"
    header = f"{first}\n# {stage.recipe} with the overrides of stage '{stage.name}' in {pipeline.path}\n"
    return header + yaml.safe_dump(merged, sort_keys=False, default_flow_style=None)
