"""The SFT / preference dataset mixture: each source is loaded with `datasets.load_dataset` (Hub id, local folder
or a data file), mapped to `messages` (or `chosen`/`rejected`) by a named converter, sub-sampled (`max_samples`) and
upsampled (`repeat`, e.g. o1-journey x10), then all sources are concatenated and shuffled with the recipe seed.

A source in a recipe:

    sources:
      - {path: HuggingFaceTB/smoltalk, config_name: all, split: train, converter: smoltalk}
      - {path: GAIR/o1-journey, split: train, converter: o1_journey, repeat: 10}
      - {tiny_world: {}, split: sft}      # the embedded TinyWorld data (instella_recipes/data/tiny_world.py)

The schema is the one pretraining uses (`instella_recipes.data.sources.SourceSpec`), without its text column and
token weight.
"""

import numpy as np
from datasets import Dataset, concatenate_datasets

from instella_recipes.core import RecipeError
from instella_recipes.data.sources import (
    PRETRAINING_ONLY,
    SourceSpec,
    find_bad_json_line,
    load_rows,
    local_files,
    make_filter,
    repeat_indices,
)

from .converters import CONVERTERS, MMLU_DATA_SEED, ROW_FILTERS, SEQUENTIAL_CONVERTERS


def parse_source(index: int, raw, default_converter: str) -> SourceSpec:
    """A post-training `sources` entry: the shared schema without the pretraining-only keys, plus a converter."""
    spec = SourceSpec.from_recipe(index, raw, exclude=PRETRAINING_ONLY - {"filters"})
    spec.converter = spec.converter or default_converter
    if spec.converter not in CONVERTERS and spec.converter not in SEQUENTIAL_CONVERTERS:
        known = sorted([*CONVERTERS, *SEQUENTIAL_CONVERTERS])
        raise RecipeError(f"sources[{index}]: unknown converter '{spec.converter}'; known: {known}")
    return spec


def _convert(dataset: Dataset, source: SourceSpec, num_proc: int | None, conversion_seed: int) -> Dataset:
    sequential = SEQUENTIAL_CONVERTERS.get(source.converter)
    fn = CONVERTERS.get(source.converter)
    try:
        next(iter(sequential([dataset[0]], conversion_seed))) if sequential else fn(dataset[0], 0)
    except (KeyError, TypeError) as err:
        known = sorted([*CONVERTERS, *SEQUENTIAL_CONVERTERS])
        raise RecipeError(
            f"source {source.path}: converter '{source.converter}' cannot read its rows (missing field {err}); "
            f"the dataset has columns {dataset.column_names}. Pick the converter for this dataset ({known})."
        ) from None
    try:
        if sequential:  # one random state over the rows in order (the authors'): one process, in row order
            return Dataset.from_list(list(sequential(dataset, conversion_seed)))
        return dataset.map(
            fn,
            with_indices=True,
            remove_columns=dataset.column_names,
            num_proc=num_proc,
            desc=f"convert {source.path}",
        )
    except (KeyError, TypeError, ValueError, UnicodeDecodeError) as err:  # a later row differs from the first
        files = local_files(source) if source.path else None
        problem = find_bad_json_line(files) if files else None
        known = sorted([*CONVERTERS, *SEQUENTIAL_CONVERTERS])
        raise RecipeError(
            problem
            or f"source {source.path}: converter '{source.converter}' failed on a row ({type(err).__name__}: "
            f"{err}); fix that row or pick the converter for this dataset ({known})"
        ) from None


def _upsample(dataset: Dataset, repeat: float | None, seed: int) -> Dataset:
    if repeat is None or repeat == 1:
        return dataset
    return dataset.select(repeat_indices(len(dataset), repeat, np.random.default_rng(seed)))


def build_mixture(
    specs: list[dict],
    seed: int = 0,
    num_proc: int | None = None,
    default_converter: str = "messages",
    conversion_seed: int = MMLU_DATA_SEED,
) -> tuple[Dataset, list[dict]]:
    """Load, convert, sub/up-sample and shuffle the sources; return the mixture and a per-source row report.
    `seed` shuffles and samples; `conversion_seed` seeds the converters' own random choices (MMLU's option order
    and template: the authors' data seed 96)."""
    if not specs:
        raise RecipeError("the recipe lists no data `sources`")
    sources = [parse_source(i, spec, default_converter) for i, spec in enumerate(specs)]
    parts, report = [], []
    for source in sources:
        dataset = load_rows(source, num_proc=num_proc)
        if source.filters:
            dataset = dataset.filter(make_filter(source.filters), batched=True, num_proc=num_proc)
        if source.converter in ROW_FILTERS:  # the converter's own rule (AM-DeepSeek-R1-Distilled: English only)
            keep = ROW_FILTERS[source.converter]
            dataset = dataset.filter(keep, num_proc=num_proc, desc=f"{source.converter}: {keep.__name__}")
        if len(dataset) == 0:
            raise RecipeError(f"source {source.path} ({source.split}) has no rows")
        if source.max_samples is not None and source.max_samples < len(dataset):
            dataset = dataset.shuffle(seed=seed).select(range(source.max_samples))
        dataset = _upsample(_convert(dataset, source, num_proc, conversion_seed), source.repeat, seed)
        report.append({"path": source.path, "split": source.split, "converter": source.converter,
                       "repeat": source.repeat or 1.0, "rows": len(dataset)})  # fmt: skip
        parts.append(dataset)
    try:
        mixed = concatenate_datasets(parts)
    except ValueError as err:
        raise RecipeError(f"the sources do not share one format after conversion: {err}") from None
    return mixed.shuffle(seed=seed), report
