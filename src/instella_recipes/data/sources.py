"""Data sources as recipes name them, for pretraining and post-training alike: local files/folders, Hub dataset ids
or the embedded TinyWorld data, each with optional row filters and an up/down-sampling rule.

One schema (`SourceSpec`) and one loader (`load_rows`) serve both: pretraining adds a text column and token weights
(`load_source`), post-training adds a converter to `messages` / `chosen`+`rejected` (post_training/mixture.py).
One upsampling rule (`repeat_indices`): floor(m) whole copies plus a seeded random subset for the fraction.

A recipe lists sources as mappings, for example::

    sources:
      - path: data/slimpajama            # a file, a folder (every jsonl/json/parquet/txt inside) or a Hub id
        text_column: text
        filters: [{column: meta.redpajama_set_name, op: "!=", value: RedPajamaBook}]
      - path: data/gutenberg
        weight: 0.05                      # proportion of the mixture's tokens (omit: natural share)
      - tiny_world: {seed: 1234}          # the project's synthetic corpus, generated in memory (no files)

Loading goes through `datasets` (the same code reads a Hub dataset on a machine with Hub access). Every error a
user can fix (missing file, missing column, malformed jsonl line, empty source) is a `RecipeError` that names the
source, file and line, raised before any tokenisation starts.
"""

import contextlib
import hashlib
import math
import operator
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import numpy as np

from instella_recipes.core import RecipeError, check_path_length, check_range, environment_cause, iter_jsonl
from instella_recipes.data.integrity import content_digests
from instella_recipes.data.tiny_world import TinyWorld

_BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".txt": "text"}
_COMPRESSED = (".gz", ".zst", ".bz2", ".xz")  # datasets decompresses these transparently


def _kind(path: Path) -> str | None:
    """The `datasets` builder for a data file (`x.jsonl`, `x.jsonl.zst`, ...), or None when it is not one."""
    suffixes = path.suffixes
    if suffixes and suffixes[-1] in _COMPRESSED:
        suffixes = suffixes[:-1]
    return _BUILDERS.get(suffixes[-1]) if suffixes else None


_OPS = {
    "==": operator.eq,
    "!=": operator.ne,
    "in": lambda a, b: a in b,
    "not_in": lambda a, b: a not in b,
    ">=": operator.ge,
    "<=": operator.le,
}


# Keys that only one side reads: a pretraining source has a text column and a token weight; a post-training source
# has a converter and a row cap.
PRETRAINING_ONLY = {"text_column", "weight", "sample_by", "filters"}
POST_TRAINING_ONLY = {"converter", "max_samples", "data_files"}


@dataclass
class SourceSpec:
    """One entry of a recipe's `sources` list."""

    path: str | None = None
    tiny_world: dict | None = None  # TinyWorld(**tiny_world); `split` picks corpus (train), sft or preferences
    name: str | None = None  # display name (default: the path)
    split: str = "train"
    config_name: str | None = None  # the Hub dataset's configuration (`load_dataset(path, config_name)`)
    revision: str | None = None
    data_files: str | list[str] | None = None
    filters: list[dict] = field(default_factory=list)
    repeat: float | None = None
    # pretraining
    text_column: str = "text"
    weight: float | None = None
    sample_by: str = "document"  # txt files: one document per file ("document"), "paragraph" or "line"
    # post-training
    converter: str | None = None
    max_samples: int | None = None

    @classmethod
    def from_recipe(cls, index: int, raw, exclude: set[str] = frozenset()) -> "SourceSpec":
        """Validate one `sources` entry; `exclude` names the keys this kind of recipe does not read."""
        if isinstance(raw, str):
            raw = {"path": raw}
        if not isinstance(raw, dict):
            raise RecipeError(f"sources[{index}]: expected a mapping with 'path' (or 'tiny_world'), got {raw!r}")
        known = set(cls.__dataclass_fields__) - set(exclude)
        unknown = sorted(set(raw) - known)
        if unknown:
            raise RecipeError(f"sources[{index}]: unknown key(s) {unknown}; known keys: {sorted(known)}")
        spec = cls(**raw)
        if (spec.path is None) == (spec.tiny_world is None):
            raise RecipeError(f"sources[{index}]: give exactly one of 'path' or 'tiny_world'")
        if spec.weight is not None and spec.repeat is not None:
            raise RecipeError(f"sources[{index}]: give 'weight' (share of tokens) or 'repeat' (multiplier), not both")
        for value, what in ((spec.weight, "weight"), (spec.repeat, "repeat"), (spec.max_samples, "max_samples")):
            check_range(f"sources[{index}]: {what}", value, 0, low_open=True, allow_none=True)
        for f in spec.filters:
            if set(f) - {"column", "op", "value"} or "column" not in f or f.get("op", "==") not in _OPS:
                raise RecipeError(
                    f"sources[{index}]: bad filter {f!r}: use {{column: a.b, op: one of {list(_OPS)}, value: v}}"
                )
        spec.name = spec.name or (f"tiny_world-{index}" if spec.tiny_world is not None else spec.path)
        return spec


def local_files(spec: SourceSpec) -> list[Path] | None:
    """The data files of a local source, or None when `path` is not local (a Hub id). A path too long for the
    filesystem or an empty file is a `RecipeError`; a file this user may not read fails here, as a `PermissionError`
    naming it (the entry point prints it as one line), not later as "No such file" from the dataset builder."""
    path = check_path_length(spec.path, f"source '{spec.name}':")
    if path.is_file():
        return [_readable(path, spec)]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and _kind(p))
        if not files:
            raise RecipeError(f"source '{spec.name}': folder {path} holds no {'/'.join(_BUILDERS)} files")
        return [_readable(p, spec) for p in files]
    looks_local = spec.path.startswith((".", "/", "~")) or _kind(Path(spec.path)) is not None
    if looks_local or spec.path.count("/") > 1:
        raise RecipeError(f"source '{spec.name}': {spec.path} does not exist (check the path in the recipe)")
    return None


def _readable(path: Path, spec: SourceSpec) -> Path:
    with open(path, "rb"):  # PermissionError (errno EACCES, the file named) for a file this user may not read
        pass
    if path.stat().st_size == 0:
        raise RecipeError(f"source '{spec.name}': {path} is empty (0 bytes): fill it or remove it from the sources")
    return path


def fingerprint(spec: SourceSpec) -> dict:
    """What identifies a source's content, so that a changed input is detected: for local files their size,
    modification time and a sha256 of their first and last MiB (cheap on TB corpora); for Hub ids the revision."""
    if spec.tiny_world is not None:
        return {"tiny_world": spec.tiny_world}
    files = local_files(spec)
    if files is None:
        return {"hub": spec.path, "config": spec.config_name, "revision": spec.revision, "split": spec.split}
    out = {}
    for path in files:
        stat = path.stat()
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            digest.update(handle.read(1 << 20))
            if stat.st_size > 2 << 20:
                handle.seek(-(1 << 20), 2)
                digest.update(handle.read())
        out[str(path)] = {"bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256_head_tail": digest.hexdigest()}
    return out


SOURCE_KIND = "sources file"  # the noun a refused resume names a changed file with (`describe_data_change`)


def source_identities(raw_sources) -> list:
    """`[path, bytes, content digest, SOURCE_KIND]` for every local data file of a recipe's `sources` (SFT, DPO,
    GRPO), for resume checks (`integrity.content_digests`): a file rewritten in place, even at the same size, gives
    another digest. The embedded TinyWorld data and Hub ids (named with their revision in the recipe) have no file
    here."""
    paths = []
    for i, raw in enumerate(raw_sources or []):
        spec = SourceSpec.from_recipe(i, raw)
        if spec.tiny_world is None and spec.path:
            paths += local_files(spec) or []
    digests = content_digests(paths)
    return [[str(path), path.stat().st_size, digest, SOURCE_KIND] for path, digest in zip(paths, digests)]


def find_bad_json_line(files: list[Path]) -> str | None:
    """`file:line: what is wrong` for the first line of an (uncompressed) jsonl file that is not a JSON object."""
    for path in files:
        if path.suffix != ".jsonl":
            continue
        try:
            for _ in iter_jsonl(path):
                pass
        except RecipeError as error:
            return str(error)
    return None


@contextlib.contextmanager
def name_undecodable_line(specs: list[SourceSpec]):
    """Arrow's JSON reader keeps bytes that are not UTF-8 and Python fails only when the text is read (training the
    tokenizer, tokenising, converting): turn that late `UnicodeDecodeError` into a `RecipeError` naming file:line."""
    try:
        yield
    except UnicodeDecodeError as err:
        files = [f for s in specs if s.path for f in (local_files(s) or [])]
        problem = find_bad_json_line(files)
        raise RecipeError(problem or f"a source holds text that is not UTF-8 ({err}); re-encode it as UTF-8") from None


def _tiny_world_rows(spec: SourceSpec) -> list[dict]:
    world = TinyWorld(**spec.tiny_world)
    makers = {
        "train": world.corpus, "corpus": world.corpus, "sft": world.sft, "preferences": world.preferences,
        "problems": lambda: world.problems("train"),  # {question, solution, answer}: GRPO prompts + verified answers
    }  # fmt: skip
    if spec.split not in makers:
        raise RecipeError(f"source '{spec.name}': tiny_world has splits {sorted(makers)}, not '{spec.split}'")
    return makers[spec.split]()


def load_rows(spec: SourceSpec, streaming: bool = False, num_proc: int | None = None):
    """The source's rows as a `datasets.Dataset` (or `IterableDataset` when streaming), filters not yet applied.
    Raises `RecipeError` naming the source (and the bad jsonl line) for anything the user must fix."""
    if spec.tiny_world is not None:
        ds = datasets.Dataset.from_list(_tiny_world_rows(spec))
        return ds.to_iterable_dataset() if streaming else ds
    files = local_files(spec)
    if files is None:
        try:
            return datasets.load_dataset(
                spec.path, spec.config_name, split=spec.split, revision=spec.revision, data_files=spec.data_files,
                streaming=streaming,
            )  # fmt: skip
        except Exception as err:  # the Hub / builder error text is the useful part
            _machine_failure(err)
            raise RecipeError(f"source '{spec.name}': could not load dataset '{spec.path}': {err}") from None
    builders = {_kind(p) for p in files}
    if len(builders) > 1:
        raise RecipeError(f"source '{spec.name}': mixes file types {sorted(builders)}; split it")
    builder = builders.pop()
    kwargs = {"sample_by": spec.sample_by} if builder == "text" else {}
    try:
        return datasets.load_dataset(
            builder, data_files=[str(p) for p in files], split="train", streaming=streaming, **kwargs
        )
    except Exception as err:
        _machine_failure(err)
        # datasets' parse errors do not say where; the line scan runs only now, so good data pays nothing
        problem = find_bad_json_line(files) if builder == "json" else None
        raise RecipeError(problem or f"source '{spec.name}': could not read {spec.path}: {err}") from None


def _machine_failure(err: Exception) -> None:
    """Re-raise a full disk or a denied permission behind `err` as itself (the entry point names it, exit 1)."""
    cause = environment_cause(err)
    if cause is not None:
        raise cause from None


def repeat_indices(num_docs: int, multiplier: float, rng: np.random.Generator) -> np.ndarray:
    """Indices of documents for a multiplier: floor(m) full copies plus a seeded random subset for the fraction."""
    whole = int(math.floor(multiplier))
    extra = int(round((multiplier - whole) * num_docs))
    parts = [np.tile(np.arange(num_docs, dtype=np.int64), whole)]
    if extra:
        parts.append(np.sort(rng.choice(num_docs, size=extra, replace=False)))
    return np.concatenate(parts)


def load_source(spec: SourceSpec, streaming: bool = False, num_proc: int | None = None):
    """A pretraining source: its rows (`load_rows`), filters applied, with the text in column "text"."""
    ds = load_rows(spec, streaming, num_proc)
    try:  # a stream reveals its columns (and a bad first batch) only when read
        columns = ds.column_names if ds.column_names is not None else list(next(iter(ds)).keys())
    except Exception as err:
        _machine_failure(err)
        files = local_files(spec) if spec.path else None
        problem = find_bad_json_line(files) if files else None
        raise RecipeError(problem or f"source '{spec.name}': could not read {spec.name}: {err}") from None
    if spec.text_column not in columns:
        raise RecipeError(
            f"source '{spec.name}': no text column '{spec.text_column}' (columns: {columns}); "
            f"set text_column for this source"
        )
    if spec.filters:
        keep = make_filter(spec.filters)
        ds = ds.filter(keep, batched=True, **({} if streaming else {"num_proc": num_proc}))
    if spec.text_column != "text":
        ds = ds.select_columns([spec.text_column]).rename_column(spec.text_column, "text")
    else:
        ds = ds.select_columns(["text"])
    if not streaming and len(ds) == 0:
        raise RecipeError(f"source '{spec.name}': no rows left (empty files, or the filters dropped every row)")
    return ds


def _get(row: dict, dotted: str):
    value = row
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def make_filter(filters: list[dict]):
    """A batched `datasets.filter` function keeping rows for which every `{column, op, value}` holds; `column`
    may be a dotted path into nested dicts (`meta.redpajama_set_name`)."""

    def keep(batch: dict) -> list[bool]:
        n = len(next(iter(batch.values())))
        out = [True] * n
        for f in filters:
            top, _, rest = f["column"].partition(".")
            values = batch.get(top, [None] * n)
            test = _OPS[f.get("op", "==")]
            for i in range(n):
                value = _get(values[i], rest) if rest else values[i]
                out[i] = out[i] and bool(test(value, f["value"]))
        return out

    return keep
