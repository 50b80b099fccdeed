"""`prepare_data` with `layout: olmo`: each source becomes one folder of OLMo token files, as one `dolma tokens`
call of the authors' `scripts/prepare_pretrain_data_stage{1,2}.sh` wrote it (`dolma_tokens.py` says how).

A source names its input files (a local folder, or a Hub dataset whose matching files are downloaded into
`raw_dir/<repo name>/`, the authors' `datasets/` layout), or a chat set and its converter (rows -> the authors'
text jsonl in `raw_dir/<name>/data.jsonl.gz` first, `chat_text.py`), and the `destination` folder under
`output_dir`, e.g. `math/tulu_math` as in the authors' configs.

A source may keep a seeded part of its input (`sample`: a fraction of the documents or a number of the files,
`sampling.py`), as the authors did for five stage-2 subsets.

Every folder is built as `<destination>.partial`, one group (`part-{g}`) at a time, each recorded when complete so
a killed run resumes at the next group; its `manifest.json` (every file's size and xxh3 checksum, computed as it was
written) is written last and the folder swapped into place. A finished folder made from the same inputs is reused;
`only` prepares some of the recipe's sources (one CPU node per source). Once every source is done, `output_dir` gets
`token_files.txt` (every token file, one path a line relative to `output_dir`, in recipe order: what `data_paths`
reads) and then its own manifest.

The output-folder rule of `core.io` holds for `output_dir` and every destination: a complete output of another stage
there is replaced only with `--overwrite` (its manifest removed first), one of ours made from other inputs too, and
`output_dir`'s manifest and list are removed before any folder under it changes. Everything a user can get wrong
is checked for every source before the first token is written.
"""

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from instella_recipes.core import (
    MANIFEST,
    RecipeError,
    atomic_write_text,
    check_output_dir,
    check_output_location,
    claim_output_dir,
    complete_stage,
    file_digest,
    get_logger,
    partial_path,
    read_manifest,
    retract_manifest,
    swap_in_folder,
    write_manifest,
)
from instella_recipes.data.chat_text import CHAT_TEXT_CONVERTERS, text_records, write_text_file
from instella_recipes.data.dolma_tokens import DolmaTokensArguments, check_first_rows, expand_documents, group_paths
from instella_recipes.data.group_writer import DONE as _DONE
from instella_recipes.data.group_writer import STATE as _STATE
from instella_recipes.data.group_writer import done_groups, write_groups
from instella_recipes.data.integrity import verify_folder
from instella_recipes.data.sampling import DocumentSample, check_sample, sample_files
from instella_recipes.data.sources import SourceSpec, load_rows
from instella_recipes.data.tokenizer import load_tokenizer

STAGE = "prepare_data"
LAYOUT = "olmo"
_TEXT_RECORD = "conversion.json"  # beside a converted chat set's data.jsonl.gz
TOKEN_LIST = "token_files.txt"  # in output_dir: every token file, one path a line (what `data_paths` reads)

logger = get_logger(__name__)


@dataclass
class TokenSource:
    """One `sources` entry of a `layout: olmo` recipe (one `dolma tokens` call)."""

    name: str
    destination: str  # folder under output_dir, as the authors' config paths name it
    path: str  # local file/folder, or a Hub dataset id
    data_files: list[str] | None = None  # patterns under path (the authors' --documents globs)
    converter: str | None = None  # a chat set: rows -> text first (chat_text.CHAT_TEXT_CONVERTERS)
    split: str = "train"  # converter sources: the split, config and revision `datasets.load_dataset` reads
    config_name: str | None = None
    revision: str | None = None
    processes: int | None = None  # this call's dolma --processes / --max_size / files_per_process when not the
    max_size: int | None = None  # recipe's
    files_per_process: int | None = None
    sample: dict | None = None  # {fraction: p} of the documents or {files: n} of the input files (sampling.py)

    @classmethod
    def from_recipe(cls, index: int, raw) -> "TokenSource":
        known = [f.name for f in fields(cls)]
        if isinstance(raw, str) and raw.lstrip().startswith("{"):  # a mapping given on the command line
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError as err:
                raise RecipeError(f"sources[{index}]: not a JSON mapping ({err.msg}): {raw}") from None
        if not isinstance(raw, dict):
            raise RecipeError(f"sources[{index}]: expected a mapping with {known[:3]}, got {raw!r}")
        unknown = sorted(set(raw) - set(known))
        if unknown:
            raise RecipeError(f"sources[{index}]: unknown key(s) {unknown} for layout olmo; known keys: {known}")
        missing = [k for k in ("name", "destination", "path") if not raw.get(k)]
        if missing:
            raise RecipeError(f"sources[{index}]: layout olmo needs {missing} (name, destination folder, path)")
        source = cls(**raw)
        if isinstance(source.data_files, str):
            source.data_files = [source.data_files]
        dest = Path(source.destination)
        if dest.is_absolute() or ".." in dest.parts:
            raise RecipeError(f"source '{source.name}': destination {dest} must be a relative folder under output_dir")
        for key in ("processes", "max_size", "files_per_process"):
            value = getattr(source, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise RecipeError(f"source '{source.name}': {key} must be an integer >= 1, got {value!r}")
        source.sample = check_sample(source.name, source.sample)
        if source.converter is not None and source.converter not in CHAT_TEXT_CONVERTERS:
            raise RecipeError(
                f"source '{source.name}': unknown converter '{source.converter}' "
                f"(known: {sorted(CHAT_TEXT_CONVERTERS)})"
            )
        return source


def _is_local(path: str) -> bool:
    """A path on disk rather than a Hub id (`org/name`); a relative folder of that shape is written `./a/b`."""
    return Path(path).exists() or path.startswith((".", "/", "~")) or path.count("/") != 1


def _settings(args, source: TokenSource) -> DolmaTokensArguments:
    return DolmaTokensArguments(
        max_size=source.max_size or args.max_size, processes=source.processes or args.processes,
        batch_size=args.batch_size, ring_size=args.ring_size,
        files_per_process=source.files_per_process or args.files_per_process, seed=args.seed,
    )  # fmt: skip


def _check_sources(args, sources: list[TokenSource], root: Path) -> None:
    """What can be checked without reading data: destinations and local paths of the sources to prepare (none may
    lie inside a destination, which a rebuild replaces)."""
    local = _local_inputs(args, sources)
    for source in sources:
        check_output_dir(root / source.destination, True, f"source '{source.name}' destination", local)
        if _is_local(source.path) and not Path(source.path).exists():
            if source.converter is not None or not _raw_copy(args, source):
                raise RecipeError(f"source '{source.name}': {source.path} does not exist (check path in the recipe)")


def _local_inputs(args, sources: list[TokenSource]) -> list[tuple[str, str]]:
    """`(name, path)` of what the sources read from disk, which no folder this stage replaces may hold."""
    return [(f"source '{s.name}' path", s.path) for s in sources if _is_local(s.path)] + [("raw_dir", args.raw_dir)]


def _ours(manifest: dict | None) -> bool:
    """A manifest this layout wrote (a destination's or output_dir's)."""
    return manifest is not None and manifest.get("stage") == STAGE and manifest.get("layout") == LAYOUT


def _raw_copy(args, source: TokenSource) -> Path | None:
    """A Hub dataset already under raw_dir/<repo name> (downloaded before, or by hand as the authors did)."""
    if not args.raw_dir:
        return None
    folder = Path(args.raw_dir) / source.path.rsplit("/", 1)[-1]
    return folder if folder.is_dir() else None


def _input_files(args, source: TokenSource) -> tuple[list[str], Path, int]:
    """The files one `dolma tokens` call reads (local matches, or the Hub dataset's matching files; with
    `sample: {files: n}` n of them), the folder they are named under, and how many matched before the sample."""
    files, base = _matching_files(args, source)
    total = len(files)
    if source.sample and "files" in source.sample:
        files = sample_files(source.name, files, source.sample["files"], args.seed)
    return files, base, total


def _matching_files(args, source: TokenSource) -> tuple[list[str], Path]:
    if source.converter is not None:
        text = _converted_text(args, source)
        return [str(text)], text.parent
    folder = Path(source.path) if Path(source.path).exists() else _raw_copy(args, source)
    if folder is None:  # a Hub dataset: fetch only the files the authors tokenised
        from huggingface_hub import snapshot_download

        local_dir = Path(args.raw_dir) / source.path.rsplit("/", 1)[-1] if args.raw_dir else None
        try:
            folder = Path(
                snapshot_download(
                    source.path, repo_type="dataset", revision=source.revision, allow_patterns=source.data_files,
                    local_dir=local_dir,
                )
            )  # fmt: skip
        except Exception as err:  # the Hub's own message says what is wrong
            raise RecipeError(f"source '{source.name}': could not download {source.path}: {err}") from None
    patterns = [str(folder / p) for p in source.data_files] if source.data_files else [str(folder)]
    try:
        return expand_documents(patterns), folder if folder.is_dir() else folder.parent
    except RecipeError as err:
        raise RecipeError(f"source '{source.name}': {err}") from None


def _converted_text(args, source: TokenSource) -> Path:
    """`raw_dir/<name>/data.jsonl.gz`, the authors' converted chat set; written once, reused while the source is
    the same, never written over a file this tool did not make."""
    folder = Path(args.raw_dir or f"{args.output_dir}.text") / source.name
    out, record_path = folder / "data.jsonl.gz", folder / _TEXT_RECORD
    record = {k: getattr(source, k) for k in ("path", "split", "config_name", "revision", "converter", "name")}
    if out.exists():
        old = json.loads(record_path.read_text()) if record_path.is_file() else None
        if old is not None and old.get("source") == record:
            return out
        if old is None and not args.overwrite:
            raise RecipeError(
                f"source '{source.name}': {out} exists and was not written by prepare_data; move it away or pass "
                f"--overwrite true"
            )
    folder.mkdir(parents=True, exist_ok=True)
    spec = SourceSpec(
        path=source.path, name=source.name, split=source.split, config_name=source.config_name,
        revision=source.revision,
    )  # fmt: skip
    rows = load_rows(spec)
    tmp = partial_path(out)
    with tqdm(total=len(rows), desc=f"chat -> text {source.name}", unit="row") as bar:
        try:
            count = write_text_file(text_records(rows, source.converter, source.name), tmp, bar.update)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, out)
    atomic_write_text(record_path, json.dumps({"source": record, "rows": count}, indent=2) + "\n")
    return out


def _fingerprint(files: list[str], settings: DolmaTokensArguments, tokenizer_sha: str, source: TokenSource) -> tuple:
    """A hash over what decides the bytes: each input file (path, size, mtime), the settings and the tokenizer."""
    stats = []
    for path in files:
        st = os.stat(path)
        stats.append([path, st.st_size, st.st_mtime_ns])
    inputs = {
        "source": asdict(source),
        "files": stats,
        "settings": asdict(settings),
        "tokenizer_sha256": tokenizer_sha,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest(), inputs


def _sample_record(source: TokenSource, plan: "_Plan", results: list[dict], seed: int) -> dict | None:
    """What the source's sample kept, for its manifest (None: no sample)."""
    if not source.sample:
        return None
    if "files" in source.sample:
        return {**source.sample, "seed": seed, "of_files": plan.total}
    lines, chars = sum(r.get("lines", 0) for r in results), sum(r.get("chars", 0) for r in results)
    kept_lines = lines - sum(r.get("sampled_out_lines", 0) for r in results)
    kept_chars = chars - sum(r.get("sampled_out_chars", 0) for r in results)
    return {
        **source.sample, "seed": seed, "files_named_under": str(plan.base), "lines_read": lines,
        "lines_kept": kept_lines, "chars_read": chars, "chars_kept": kept_chars,
        "kept_share_of_lines": round(kept_lines / lines, 6) if lines else None,
        "kept_share_of_chars": round(kept_chars / chars, 6) if chars else None,
    }  # fmt: skip


def _open_destination(args, plan: "_Plan") -> None:
    """Open `plan.dest`'s partial folder: resume it when it is being built from the same inputs (the groups
    recorded as done stay), else start it empty. Sets the plan's work folder, groups, groups to do and sample."""
    dest, digest = plan.dest, plan.digest
    work = plan.work = partial_path(dest)
    state = work / _STATE
    resumed = work.is_dir() and state.is_file() and json.loads(state.read_text()).get("fingerprint") == digest
    if not resumed:
        shutil.rmtree(work, ignore_errors=True)
        (work / _DONE).mkdir(parents=True)
        atomic_write_text(state, json.dumps({"fingerprint": digest}) + "\n")
    plan.groups = group_paths(plan.files, plan.settings)
    done = done_groups(work)
    plan.todo = [g for g in range(len(plan.groups)) if g not in done]
    if resumed:
        logger.info(f"prepare_data: resuming {dest}: {len(done)} of {len(plan.groups)} groups already written")
    source = plan.source
    if source.sample and "fraction" in source.sample:
        plan.sample = DocumentSample(source.sample["fraction"], args.seed, source.name, str(plan.base))


def write_plan_groups(plan: "_Plan", groups: list[int], tok, eos_id, dtype, num_proc: int) -> None:
    """Write `groups` of `plan` (those not recorded as done) into its partial folder, `num_proc` workers."""
    todo = sorted(set(groups) - done_groups(plan.work))
    write_groups(plan.work, plan.groups, todo, tok, eos_id, dtype, plan.settings, num_proc, plan.sample)


def _finish_destination(args, plan: "_Plan", meta) -> None:
    """Once every group of `plan` is done: write its manifest last and swap the folder into place (a folder there
    loses its manifest first: `swap_in_folder`)."""
    source, dest, groups, work = plan.source, plan.dest, plan.groups, plan.work
    missing = sorted(set(range(len(groups))) - done_groups(work))
    if missing:
        raise RecipeError(
            f"source '{source.name}': groups {missing[:10]}{' ...' if len(missing) > 10 else ''} of {len(groups)} "
            f"are not written yet ({work}); run prepare_data again to write them"
        )
    results = [json.loads((work / _DONE / f"{g}.json").read_text()) for g in range(len(groups))]
    token_files = [f for r in results for f in r["files"]]
    invalid = sum(r["invalid_rows"] for r in results)
    if invalid:
        examples = [e for r in results for e in r["examples"]][:5]
        logger.warning(f"prepare_data: {source.name}: skipped {invalid} rows dolma skips, e.g. {examples}")
    shutil.rmtree(work / _DONE)
    (work / _STATE).unlink()
    sampled = _sample_record(source, plan, results, args.seed)
    write_manifest(
        work, STAGE, digests={k: v for r in results for k, v in r.get("digests", {}).items()}, layout=LAYOUT,
        fingerprint=plan.digest, inputs=plan.inputs, **meta, sample=sampled,
        token_files=token_files, num_files=len(token_files), total_tokens=sum(f["tokens"] for f in token_files),
        documents=sum(f["documents"] for f in token_files),
        skipped_rows={"empty_text": sum(r["empty_rows"] for r in results), "invalid": invalid},
        groups=[[Path(p).name for p in g] for g in groups],
    )  # fmt: skip
    swap_in_folder(work, dest)  # a folder there (only with --overwrite, checked before any work): manifest first
    logger.info(f"prepare_data: wrote {len(token_files)} token files to {dest}")


@dataclass
class _Plan:
    """One source to prepare: where it goes and what is there now (`existing`: that folder's manifest)."""

    source: TokenSource
    dest: Path
    existing: dict | None
    files: list[str] = field(default_factory=list)  # the rest is filled once its inputs are read
    base: Path | None = None
    total: int = 0
    settings: DolmaTokensArguments | None = None
    digest: str = ""
    inputs: dict = field(default_factory=dict)
    work: Path | None = None  # the partial folder, its groups (input paths) and those not yet written
    groups: list[list[str]] = field(default_factory=list)
    todo: list[int] = field(default_factory=list)
    sample: DocumentSample | None = None


@dataclass
class TokenWork:
    """A checked `layout: olmo` run: the sources whose folders are to be (re)built, with their partial folders open,
    and what the finish needs (every source of the recipe, the tokenizer and the manifests' common fields)."""

    root: Path
    every_source: list[TokenSource]
    plans: list[_Plan]
    meta: dict
    tok: object
    eos_id: int
    dtype: np.dtype


def _plan_sources(args, sources: list[TokenSource], root: Path, root_replaced: bool) -> list[_Plan]:
    """Every destination checked against the output-folder rule before any work: a complete output of another
    stage, or a folder of other files, is replaced only with --overwrite."""
    plans = []
    for source in sources:
        dest = root / source.destination
        what = f"source '{source.name}' destination"
        existing = None if root_replaced else (read_manifest(dest) if dest.is_dir() else None)
        if existing is not None and not _ours(existing):
            check_output_dir(dest, args.overwrite, what)  # the rule of core.io: refused without --overwrite
            existing = None  # replaced, as a folder of other files is
        elif not root_replaced and dest.is_dir() and existing is None and any(dest.iterdir()) and not args.overwrite:
            raise RecipeError(
                f"{what} {dest} exists and is not a finished prepare_data folder; move it away or pass --overwrite "
                f"true"
            )
        plans.append(_Plan(source, dest, existing))
    return plans


def _claim_root(root: Path, overwrite: bool, foreign: bool) -> None:
    """Before the first byte under `output_dir`: its manifest goes first (durably), then its token list; a complete
    output of another stage there (only with --overwrite) is emptied, as `claim_output_dir` does."""
    if foreign:
        claim_output_dir(root, overwrite)
        return
    retract_manifest(root)
    (root / TOKEN_LIST).unlink(missing_ok=True)


def prepare_token_files(args) -> Path:
    """Write (or reuse) one folder of OLMo token files per source under `args.output_dir`; return that root. In this
    process, `num_proc` workers; `token_tasks.py` runs the same groups as datatrove tasks."""
    work = plan_token_files(args)
    for plan in work.plans:
        write_plan_groups(plan, plan.todo, work.tok, work.eos_id, work.dtype, args.num_proc or 1)
    return finish_token_files(args, work)


def plan_token_files(args) -> TokenWork:
    """Every check of a `layout: olmo` run, before any token is written; then the partial folder of every source to
    (re)build is opened (resumed where it was being built from the same inputs)."""
    if not args.sources:
        raise RecipeError("no sources: list at least one under 'sources' in the recipe")
    if not args.tokenizer:
        raise RecipeError("layout olmo needs 'tokenizer' (the authors': a tokenizer.json such as recipes/instella-3b/"
                          "tokenizer/allenai_eleuther-ai-gpt-neox-20b-pii-special.json)")  # fmt: skip
    sources = every_source = [TokenSource.from_recipe(i, raw) for i, raw in enumerate(args.sources)]
    for key in ("name", "destination"):
        values = [getattr(s, key) for s in every_source]
        if len(set(values)) != len(values):
            raise RecipeError(f"source {key}s must be unique: {values}")
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in sources})
        if unknown:
            raise RecipeError(f"only: no source named {unknown} (sources: {[s.name for s in sources]})")
        sources = [s for s in sources if s.name in args.only]
    root = check_output_location(args.output_dir)
    foreign_root = complete_stage(root) is not None and not _ours(read_manifest(root))
    if foreign_root:  # another stage's complete output: refused without --overwrite (the rule of core.io)
        check_output_dir(root, args.overwrite, inputs=_local_inputs(args, every_source))
    _check_sources(args, sources, root)
    try:
        wrapped = load_tokenizer(args.tokenizer)
    except (OSError, ValueError) as err:
        raise RecipeError(f"tokenizer {args.tokenizer}: {err}") from None
    tok = wrapped.backend_tokenizer
    if Path(args.tokenizer).is_file():  # the file itself, as dolma reads it (no transformers wrapper in between)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(args.tokenizer)
    eos_id = wrapped.eos_token_id
    if eos_id is None:
        raise RecipeError(f"tokenizer {args.tokenizer} has no EOS token; documents must end with one")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    dtype = np.dtype(np.min_scalar_type(vocab - 1)).newbyteorder("<")  # dolma's rule: uint16 up to 65,536 ids
    tokenizer_sha = hashlib.sha256(tok.to_str().encode()).hexdigest()
    meta = {
        "tokenizer": args.tokenizer, "tokenizer_sha256": tokenizer_sha,
        "tokenizer_file_sha256": file_digest(args.tokenizer) if Path(args.tokenizer).is_file() else None,
        "eos_token_id": eos_id, "bos_added": False, "vocab_size": vocab, "dtype": dtype.name,
        "dolma_equivalent": "dolma tokens (1.0.14-1.1.2) with its random module seeded: file order Random(seed), "
        "group g Random(f'{seed}-{g}')",
    }  # fmt: skip
    plans = _plan_sources(args, sources, root, foreign_root)  # every check before any token is written
    todo = []
    claimed = False
    if foreign_root:
        _claim_root(root, args.overwrite, foreign=True)
        claimed = True
    for plan in plans:
        source = plan.source
        plan.files, plan.base, plan.total = _input_files(args, source)
        check_first_rows(plan.files)
        plan.settings = _settings(args, source)
        plan.digest, plan.inputs = _fingerprint(plan.files, plan.settings, tokenizer_sha, source)
        if plan.existing is not None and plan.existing.get("fingerprint") == plan.digest:
            what = f"source '{source.name}' destination"
            try:  # sizes, and checksums as far as start-up checks them: a damaged folder is not "up to date"
                verify_folder(plan.dest, plan.existing, what, f"python scripts/verify_data.py --folders {plan.dest}")
            except RecipeError as err:
                if not args.overwrite:
                    raise
                logger.warning(f"prepare_data: {err}; writing it again (--overwrite true)")
            else:
                logger.info(f"prepare_data: {plan.dest} is up to date ({plan.existing['num_files']} token files)")
                continue
        if plan.existing is not None and not args.overwrite:
            raise RecipeError(
                f"source '{source.name}': {plan.dest} was made from other inputs (files, settings, sample or "
                f"tokenizer); pass --overwrite true or choose another output_dir"
            )
        if not claimed:  # the root's summary and list no longer hold while a folder under it changes
            _claim_root(root, args.overwrite, foreign=False)
            claimed = True
        _open_destination(args, plan)
        todo.append(plan)
    return TokenWork(root, every_source, todo, meta, tok, eos_id, dtype)


def finish_token_files(args, work: TokenWork) -> Path:
    """Once every group is written: each rebuilt folder's manifest and swap, then `token_files.txt` and the root's
    manifest (when every source of the recipe has its folder); returns the root."""
    for plan in work.plans:
        _finish_destination(args, plan, work.meta)
    _write_root_manifest(work.root, work.every_source, work.meta)
    return work.root


def _write_root_manifest(root: Path, sources: list[TokenSource], meta: dict) -> None:
    """Once every source of the recipe has its finished folder (runs with `only` may have made them on several
    nodes): `output_dir/token_files.txt` lists their token files, one path a line relative to `output_dir`, in
    recipe order (a `data_paths` list), then `output_dir/manifest.json` records the sources and describes the list
    and each source's manifest (which describes its files): the pipeline's sign that the stage is complete."""
    folders, files = {}, []
    for source in sources:
        manifest = read_manifest(root / source.destination)
        if not _ours(manifest):
            return
        folders[source.name] = {
            "destination": source.destination, "fingerprint": manifest["fingerprint"],
            "num_files": manifest["num_files"], "total_tokens": manifest["total_tokens"],
            "sample": manifest.get("sample"),
        }  # fmt: skip
        files += [f"{source.destination}/{f['file']}" for f in manifest["token_files"]]
    text = "".join(f"{name}\n" for name in files)
    old, listed = read_manifest(root), root / TOKEN_LIST
    if (
        _ours(old) and old.get("sources") == folders and old.get("token_files") == files
        and listed.is_file() and listed.read_text() == text
    ):  # fmt: skip
        return  # unchanged: keep its digest, so the pipeline does not rerun what reads it
    retract_manifest(root)
    atomic_write_text(listed, text)
    write_manifest(
        root, STAGE, describe=[TOKEN_LIST, *(f"{s.destination}/{MANIFEST}" for s in sources)], layout=LAYOUT,
        sources=folders, token_list=TOKEN_LIST, token_files=files, num_files=len(files),
        total_tokens=sum(v["total_tokens"] for v in folders.values()), **meta,
    )  # fmt: skip
