"""The SFT / preference dataset mixture: each source is loaded with `datasets.load_dataset` (Hub id, local folder
or a data file), mapped to `messages` (or `chosen`/`rejected`) by a named converter, sub-sampled (`max_samples`) and
upsampled (`repeat`, e.g. o1-journey x10), then all sources are concatenated and shuffled with the recipe seed.

A source in a recipe:

    sources:
      - {path: HuggingFaceTB/smoltalk, name: all, split: train, converter: smoltalk}
      - {path: GAIR/o1-journey, split: train, converter: o1_journey, repeat: 10}
      - {path: tiny_world, split: sft}      # the embedded TinyWorld data (instella_recipes/data/tiny_world.py)
"""

import math
from dataclasses import dataclass, fields
from pathlib import Path

from datasets import Dataset, concatenate_datasets, load_dataset

from instella_recipes.core import RecipeError
from instella_recipes.data.tiny_world import TinyWorld

from .converters import CONVERTERS

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass
class Source:
    path: str
    split: str = "train"
    name: str | None = None
    data_files: str | list[str] | None = None
    converter: str = "messages"
    repeat: float = 1.0
    max_samples: int | None = None

    @classmethod
    def parse(cls, spec: dict, where: str) -> "Source":
        known = {f.name for f in fields(cls)}
        if not isinstance(spec, dict) or "path" not in spec:
            raise RecipeError(f"{where}: each source needs at least `path` (got {spec!r})")
        unknown = set(spec) - known
        if unknown:
            raise RecipeError(f"{where}: unknown source key(s) {sorted(unknown)}; known: {sorted(known)}")
        source = cls(**spec)
        if source.converter not in CONVERTERS:
            raise RecipeError(f"{where}: unknown converter '{source.converter}'; known: {sorted(CONVERTERS)}")
        if not source.repeat > 0:
            raise RecipeError(f"{where}: repeat must be > 0 (got {source.repeat})")
        return source


def _load(source: Source) -> Dataset:
    if source.path == "tiny_world":
        world = TinyWorld()
        makers = {"sft": world.sft, "preferences": world.preferences, "corpus": world.corpus}
        if source.split not in makers:
            raise RecipeError(f"tiny_world has splits {sorted(makers)}, not '{source.split}'")
        return Dataset.from_list(makers[source.split]())
    builder = _FILE_BUILDERS.get(Path(source.path).suffix)
    if builder:
        if not Path(source.path).is_file():
            raise RecipeError(f"data file {source.path} does not exist")
        return load_dataset(builder, data_files=source.path, split="train")
    return load_dataset(source.path, source.name, data_files=source.data_files, split=source.split)


def _convert(dataset: Dataset, source: Source, num_proc: int | None) -> Dataset:
    fn = CONVERTERS[source.converter]
    try:
        fn(dataset[0], 0)
    except (KeyError, TypeError) as err:
        raise RecipeError(
            f"source {source.path}: converter '{source.converter}' cannot read its rows (missing field {err}); "
            f"the dataset has columns {dataset.column_names}. Pick the converter for this dataset "
            f"({sorted(CONVERTERS)})."
        ) from None
    return dataset.map(
        fn, with_indices=True, remove_columns=dataset.column_names, num_proc=num_proc, desc=f"convert {source.path}"
    )


def _upsample(dataset: Dataset, repeat: float, seed: int) -> Dataset:
    whole, frac = int(math.floor(repeat)), repeat - math.floor(repeat)
    parts = [dataset] * whole
    if frac > 0:
        parts.append(dataset.shuffle(seed=seed).select(range(round(frac * len(dataset)))))
    return concatenate_datasets(parts)


def build_mixture(
    specs: list[dict], seed: int = 0, num_proc: int | None = None, default_converter: str = "messages"
) -> tuple[Dataset, list[dict]]:
    """Load, convert, sub/up-sample and shuffle the sources; return the mixture and a per-source row report."""
    if not specs:
        raise RecipeError("the recipe lists no data `sources`")
    specs = [{"converter": default_converter, **spec} if isinstance(spec, dict) else spec for spec in specs]
    sources = [Source.parse(spec, f"sources[{i}]") for i, spec in enumerate(specs)]
    parts, report = [], []
    for source in sources:
        dataset = _load(source)
        if len(dataset) == 0:
            raise RecipeError(f"source {source.path} ({source.split}) has no rows")
        if source.max_samples is not None and source.max_samples < len(dataset):
            dataset = dataset.shuffle(seed=seed).select(range(source.max_samples))
        dataset = _upsample(_convert(dataset, source, num_proc), source.repeat, seed)
        report.append({"path": source.path, "split": source.split, "converter": source.converter,
                       "repeat": source.repeat, "rows": len(dataset)})  # fmt: skip
        parts.append(dataset)
    try:
        mixed = concatenate_datasets(parts)
    except ValueError as err:
        raise RecipeError(f"the sources do not share one format after conversion: {err}") from None
    return mixed.shuffle(seed=seed), report
