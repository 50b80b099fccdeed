"""The data-preparation stage: sources -> tokenised, mixed, packed windows in a folder with a manifest
(`layout: packed`, the default), or -> OLMo token files as the authors' `dolma tokens` wrote them, one folder per
source (`layout: olmo`, data/olmo_layout.py).

`scripts/prepare_data.py` runs `main`; tests and the pipeline call `prepare(args)`.
The folder is built in `<output_dir>.partial` and renamed into place after its manifest is written, so a folder
named `output_dir` is always complete. A second run with the same inputs reuses it; changed inputs (files, recipe,
tokenizer, seed, window) are reported and need `--overwrite true`.
"""

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import datasets
import numpy as np
from tqdm.auto import tqdm

from instella_recipes.core import (
    RecipeError,
    atomic_output_dir,
    check_choice,
    check_output_dir,
    check_output_location,
    check_positive,
    check_range,
    environment_cause,
    exit_on_recipe_error,
    file_digest,
    get_logger,
    parse_recipe,
    read_manifest,
    setup_logging,
    write_manifest,
)
from instella_recipes.data import mds
from instella_recipes.data.dolma_tokens import DOLMA_BATCH_SIZE, DOLMA_MAX_SIZE, DOLMA_RING_SIZE
from instella_recipes.data.olmo_layout import prepare_token_files
from instella_recipes.data.packing import (
    TOKENS,
    WindowWriter,
    make_tokenize_fn,
    mixture_multipliers,
    token_dtype,
    write_shuffled,
)
from instella_recipes.data.sources import (
    POST_TRAINING_ONLY,
    SourceSpec,
    find_bad_json_line,
    fingerprint,
    load_source,
    local_files,
    name_undecodable_line,
    repeat_indices,
)
from instella_recipes.data.task_runs import prepare_with_tasks
from instella_recipes.data.token_tasks import task_status
from instella_recipes.data.tokenizer import load_tokenizer, train_bpe_tokenizer

STAGE = "prepare_data"

logger = get_logger(__name__)


@dataclass
class PrepareArguments:
    """Arguments of `scripts/prepare_data.py` (one recipe YAML; CLI flags override)."""

    output_dir: str = field(
        metadata={"help": "packed: folder for tokens.bin + tokenizer/ + manifest.json; olmo: the root of the "
                  "sources' destination folders."}
    )  # fmt: skip
    layout: str = field(
        default="packed",
        metadata={"help": "packed: shuffled fixed windows (tokens.bin); olmo: the authors' token files, as `dolma "
                  "tokens` writes them (part-*.npy per source destination); mds: one MDS folder per source, rows "
                  "of seq_len tokens with their document spans, the layout of the authors' amd/Instella-Long "
                  "(pretrain's mds_streams reads <output_dir>/<name>@<weight>)."},
    )  # fmt: skip
    sources: list[str] | None = field(
        default=None, metadata={"help": "Source mappings (see instella_recipes/data/sources)."}
    )
    label_mask_after: str | None = field(
        default=None,
        metadata={"help": "layout mds: SFT-style rows with a label_mask column: a document's tokens after the first "
                  "occurrence of this text (its answer and EOS) are targets, the rest not (a document without it "
                  "has none); SFT's mds_streams trains on the targets only."},
    )  # fmt: skip
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer.json, folder or Hub id."})
    train_tokenizer_vocab_size: int | None = field(
        default=None, metadata={"help": "No tokenizer given: train a byte-level BPE of this size on the sources."}
    )
    seq_len: int = field(default=4096, metadata={"help": "Window length in tokens (4096 Instella, 2048 Llama-135m)."})
    seed: int = field(default=0, metadata={"help": "Seed of the document order and the up/down-sampling."})
    num_proc: int | None = field(
        default=None,
        metadata={"help": "packed: datasets.map processes; olmo: worker processes writing the groups, one core each "
                  "(default 1: then the tokenizer uses every core itself)."},
    )  # fmt: skip
    batch_size: int | None = field(
        default=None,
        metadata={"help": "packed: documents per tokenisation batch (default 1000); olmo: dolma's --batch_size, "
                  "documents shuffled together before writing (default 10000)."},
    )  # fmt: skip
    total_tokens: int | None = field(default=None, metadata={"help": "Mixture size for weights (default natural)."})
    streaming: bool = field(default=False, metadata={"help": "Stream sources (corpora larger than the disk cache)."})
    shuffle_buffer: int = field(default=10000, metadata={"help": "Streaming: documents in the shuffle buffer."})
    max_tokens: int | None = field(default=None, metadata={"help": "Streaming: stop after this many tokens."})
    overwrite: bool = field(default=False, metadata={"help": "Rebuild an output folder made from other inputs."})
    # layout olmo (dolma tokens' options; the authors' values are in recipes/instella-3b/prepare_stage{1,2}.yaml)
    max_size: int = field(
        default=DOLMA_MAX_SIZE, metadata={"help": "olmo: tokens per file, exclusive (dolma's --max_size)."}
    )
    processes: int = field(
        default=1, metadata={"help": "olmo: dolma's --processes, which fixes the output groups (part-*); the "
                             "worker processes that run them are num_proc."}
    )  # fmt: skip
    ring_size: int = field(default=DOLMA_RING_SIZE, metadata={"help": "olmo: files read at once per group."})
    files_per_process: int | None = field(default=None, metadata={"help": "olmo: at most this many files a group."})
    raw_dir: str | None = field(
        default=None,
        metadata={"help": "olmo: Hub datasets' files go to <raw_dir>/<repo name>/ (used as is when present), chat "
                  "sets converted to <raw_dir>/<name>/data.jsonl.gz (default <output_dir>.text)."},
    )  # fmt: skip
    only: list[str] | None = field(default=None, metadata={"help": "olmo: prepare only these sources (names)."})
    # layout olmo over many processes or nodes: datatrove tasks (data/token_tasks.py)
    executor: str | None = field(
        default=None,
        metadata={"help": "olmo: run the groups as datatrove tasks, `local` (this machine) or `slurm` (a job array "
                  "and a finishing job; returns once submitted). Unset: this process, num_proc workers."},
    )  # fmt: skip
    tasks: int = field(default=1, metadata={"help": "olmo with executor: tasks the groups are spread over."})
    workers: int | None = field(
        default=None, metadata={"help": "olmo with executor: tasks run at once (local default 1; slurm: no limit)."}
    )
    slurm_partition: str | None = field(default=None, metadata={"help": "executor slurm: the partition."})
    slurm_time: str = field(default="48:00:00", metadata={"help": "executor slurm: each task's time limit."})
    wait: bool = field(
        default=False, metadata={"help": "executor slurm: wait until the finishing job ended (exit 1 if incomplete)."}
    )
    status: bool = field(
        default=False, metadata={"help": "olmo: print which tasks and groups are done, then exit (no work)."}
    )

    def __post_init__(self):
        check_choice("layout", self.layout, ("packed", "olmo", "mds"))
        if self.layout == "mds" and self.streaming:
            raise RecipeError("layout mds reads its sources in memory: drop streaming (it is for layout packed)")
        if self.label_mask_after is not None and (self.layout != "mds" or not self.label_mask_after):
            raise RecipeError("label_mask_after: a non-empty text, for layout mds only (SFT-style rows, label_mask)")
        if self.batch_size is None:
            self.batch_size = DOLMA_BATCH_SIZE if self.layout == "olmo" else 1000
        check_positive(self, "batch_size", "shuffle_buffer", "max_size", "processes", "ring_size")
        check_range("files_per_process", self.files_per_process, 1, integer=True, allow_none=True)
        check_range("seq_len", self.seq_len, 2, integer=True, hint="tokens per window")
        check_range("train_tokenizer_vocab_size", self.train_tokenizer_vocab_size, 1, integer=True, allow_none=True)
        check_range("num_proc", self.num_proc, 1, integer=True, allow_none=True)
        check_range("total_tokens", self.total_tokens, 1, integer=True, allow_none=True)
        check_range("max_tokens", self.max_tokens, 1, integer=True, allow_none=True)
        check_range("seed", self.seed, 0, integer=True)
        if self.executor is not None:
            check_choice("executor", self.executor, ("local", "slurm"))
        check_range("tasks", self.tasks, 1, integer=True)
        check_range("workers", self.workers, 1, integer=True, allow_none=True)
        if (self.executor or self.status or self.tasks > 1) and self.layout != "olmo":
            raise RecipeError("executor, tasks and status are for layout olmo (the packed layout runs on one machine)")
        if self.tasks > 1 and self.executor is None:
            raise RecipeError("tasks > 1 needs an executor: --executor local (this machine) or slurm")


def _tokenizer_identity(args: PrepareArguments) -> str:
    if args.tokenizer is None:
        if not args.train_tokenizer_vocab_size:
            raise RecipeError("set 'tokenizer' (tokenizer.json, folder or Hub id) or 'train_tokenizer_vocab_size'")
        return f"trained-bpe-{args.train_tokenizer_vocab_size}"
    path = Path(args.tokenizer)
    if path.is_file():
        return file_digest(path)
    if (path / "tokenizer.json").is_file():
        return file_digest(path / "tokenizer.json")
    if path.exists() or args.tokenizer.startswith((".", "/")):
        raise RecipeError(f"tokenizer {args.tokenizer}: not a tokenizer.json file or a folder holding one")
    return f"hub:{args.tokenizer}"


def input_fingerprint(args: PrepareArguments, specs: list[SourceSpec]) -> tuple[str, dict]:
    """A hash over everything that determines the output: source specs and contents, tokenizer, window, seed."""
    inputs = {
        "sources": [{**asdict(s), "content": fingerprint(s)} for s in specs],
        "tokenizer": _tokenizer_identity(args),
        "seq_len": args.seq_len,
        "seed": args.seed,
        "total_tokens": args.total_tokens,
        "streaming": args.streaming,
        "max_tokens": args.max_tokens,
        "shuffle_buffer": args.shuffle_buffer if args.streaming else None,
        **({"label_mask_after": args.label_mask_after} if args.label_mask_after is not None else {}),
    }
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest(), inputs


def _changed(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if json.dumps(old.get(k), default=str, sort_keys=True)
                  != json.dumps(new.get(k), default=str, sort_keys=True))  # fmt: skip


def _get_tokenizer(args: PrepareArguments, loaded: list):
    if args.tokenizer is not None:
        try:
            return load_tokenizer(args.tokenizer)
        except (OSError, ValueError) as err:
            raise RecipeError(f"tokenizer {args.tokenizer}: {err}") from None
    texts = (text for ds in loaded for text in ds["text"])
    return train_bpe_tokenizer(texts, vocab_size=args.train_tokenizer_vocab_size)


def _write_windows(args, specs, loaded, tokenize, writer: WindowWriter, num_proc: int) -> tuple[dict, int]:
    """Tokenise and pack every source into `writer`; returns the per-source token counts and the dropped tail
    tokens. A mixture smaller than one window is an error (the caller's partial folder is then removed)."""
    if args.streaming:
        counts = _stream(args, specs, loaded, tokenize, writer)
    else:
        counts = _in_memory(args, specs, loaded, tokenize, writer, num_proc)
    dropped = writer.close()
    if writer.windows == 0:
        raise RecipeError(
            f"the sources hold {writer.tokens_in} tokens, fewer than one window of seq_len {args.seq_len}: "
            f"add data or lower seq_len"
        )
    return counts, dropped


def prepare(args: PrepareArguments) -> Path:
    """Build (or reuse) the prepared folder; return its path."""
    if args.layout == "olmo":
        return prepare_with_tasks(args) if args.executor else prepare_token_files(args)
    if not args.sources:
        raise RecipeError("no sources: list at least one under 'sources' in the recipe")
    specs = [SourceSpec.from_recipe(i, raw, exclude=POST_TRAINING_ONLY) for i, raw in enumerate(args.sources)]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise RecipeError(f"source names must be unique (set 'name'): {names}")
    out = check_output_location(args.output_dir)
    digest, inputs = input_fingerprint(args, specs)
    existing = read_manifest(out) if out.exists() else None
    if existing is not None and existing.get("stage") == STAGE and existing.get("fingerprint") == digest:
        rows = existing.get("mds_rows")
        size = f"MDS rows {rows}" if rows is not None else f"{existing['num_windows']} windows"
        logger.info(f"prepare_data: {out} is up to date ({size}); reusing it")
        return out
    # what the sources read from disk: no folder this stage replaces may be or hold one (core.io's output rule)
    local = [(f"source '{s.name}' path", s.path) for s in specs if s.path]
    if existing is None or existing.get("stage") != STAGE:  # another stage's output: the rule of core.io
        check_output_dir(out, args.overwrite, inputs=local)
    if out.exists() and any(out.iterdir()) and not args.overwrite:
        what = (
            f"made from different inputs (changed: {', '.join(_changed(existing.get('inputs', {}), inputs))})"
            if existing
            else "not a finished prepare_data output"
        )
        raise RecipeError(f"output_dir {out} exists and is {what}; pass --overwrite true or choose another output_dir")

    # One process by default: the Rust tokenizer spreads each batch over all cores itself (measured 0.93 of the bare
    # encode on 2 cores, vs 0.74-0.8 with 2 forked map processes); num_proc > 1 pays off on many-core CPU nodes.
    num_proc = args.num_proc or 1
    loaded = [load_source(s, streaming=args.streaming, num_proc=num_proc) for s in specs]
    with name_undecodable_line(specs):
        tokenizer = _get_tokenizer(args, [] if args.streaming else loaded)
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise RecipeError(f"tokenizer {args.tokenizer} has no EOS token; documents must end with one")
    dtype = token_dtype(len(tokenizer))

    # overwrite: an existing folder was refused above unless --overwrite; it is replaced only once complete
    if args.layout == "mds":
        return _prepare_mds(args, specs, loaded, tokenizer, out, digest, inputs, local)
    with atomic_output_dir(out, overwrite=args.overwrite, inputs=local) as partial:
        tokenizer.save_pretrained(partial / "tokenizer")
        writer = WindowWriter(partial / TOKENS, args.seq_len, dtype)
        with name_undecodable_line(specs):
            counts, dropped = _write_windows(
                args, specs, loaded, make_tokenize_fn(tokenizer, eos_id, dtype), writer, num_proc
            )
        tok_json = partial / "tokenizer" / "tokenizer.json"
        write_manifest(
            partial,
            STAGE,
            digests={TOKENS: writer.digest()},  # hashed as it was written: not read again
            fingerprint=digest,
            inputs=inputs,
            tokens=counts,
            seq_len=args.seq_len,
            num_windows=writer.windows,
            total_tokens=writer.windows * args.seq_len,
            dropped_tail_tokens=dropped,
            dtype=dtype.name,
            eos_token_id=eos_id,
            bos_added=False,
            vocab_size=len(tokenizer),
            tokenizer_sha256=file_digest(tok_json) if tok_json.exists() else None,
            seed=args.seed,
        )
    logger.info(f"prepare_data: wrote {writer.windows} windows of {args.seq_len} tokens to {out}")
    return out


def mds_folder_names(specs) -> list[str]:
    """Each source's MDS folder under output_dir: its `name` when that is one plain folder name, else the last part
    of its path without the suffix (`runs/demo/data/long_corpus.jsonl` -> `long_corpus`), so a source given as a path
    (the default name) never writes outside output_dir nor nests its folders. Two sources with one folder: an error
    before any work, naming them and what to do."""
    folders = []
    for spec in specs:
        name = spec.name or ""
        plain = name and "/" not in name and "\\" not in name and name not in (".", "..")
        folders.append(name if plain else Path(name.rstrip("/")).stem or name.strip("/").replace("/", "_"))
    for folder in set(folders):
        clash = [s.name for s, f in zip(specs, folders) if f == folder]
        if len(clash) > 1:
            raise RecipeError(
                f"layout mds: sources {clash} would share the MDS folder '{folder}': give each a distinct 'name'"
            )
    return folders


def _prepare_mds(args, specs, loaded, tokenizer, out: Path, digest: str, inputs: dict, local: list) -> Path:
    """layout mds: each source's documents (tokenised as for the other layouts: no BOS, EOS appended) in their
    order, packed into rows of seq_len tokens with their spans and written by streaming's MDSWriter to
    <output_dir>/<name>/ (data/mds.py), the tokenizer beside them; a pretraining run mixes the folders by the
    proportions it names (mds_streams), as the authors' runs mix theirs."""
    folders = mds_folder_names(specs)
    eos_id = tokenizer.eos_token_id
    tokenize = make_tokenize_fn(tokenizer, eos_id, np.int64)
    with atomic_output_dir(out, overwrite=args.overwrite, inputs=local) as partial:
        tokenizer.save_pretrained(partial / "tokenizer")
        rows = {}
        for spec, ds, folder in zip(specs, loaded, folders):
            if args.label_mask_after is not None:
                docs = _masked_documents(ds, tokenizer, args.label_mask_after, args.batch_size)
            else:
                tok = ds.with_format("arrow").map(
                    tokenize, batched=True, batch_size=args.batch_size, remove_columns=["text"],
                    desc=f"tokenizing {spec.name}",
                )  # fmt: skip
                batches = tok.with_format(None).iter(batch_size=args.batch_size)
                docs = (ids for batch in batches for ids in batch["input_ids"])
            try:
                rows[folder] = mds.write_mds(partial / folder, mds.pack_rows(docs, args.seq_len),
                                             partial / "tokenizer")  # fmt: skip
            except RecipeError as err:
                raise RecipeError(f"source '{spec.name}': {err}") from None
        write_manifest(
            partial, STAGE, fingerprint=digest, inputs=inputs, layout="mds", seq_len=args.seq_len, mds_rows=rows,
            eos_token_id=eos_id, bos_added=False, vocab_size=len(tokenizer), seed=args.seed,
        )  # fmt: skip
    logger.info(f"prepare_data: wrote MDS folders {rows} (rows of {args.seq_len} tokens) to {out}")
    return out


def _masked_documents(ds, tokenizer, marker: str, batch_size: int):
    """`(ids, mask)` per document, tokenised as the other layouts (no BOS, EOS appended), the mask 1 on the tokens
    that start after the first `marker` (and on the EOS), 0 before; a document without the marker is all 0. One
    encode of the whole text: the token offsets say where the marker ends."""
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    for batch in ds.iter(batch_size=batch_size):
        for text, enc in zip(batch["text"], backend.encode_batch(batch["text"], add_special_tokens=False)):
            at = text.find(marker)
            start = at + len(marker) if at >= 0 else None
            mask = [int(start is not None and begin >= start) for begin, _ in enc.offsets]
            yield [*enc.ids, tokenizer.eos_token_id], [*mask, int(start is not None)]


def _in_memory(args, specs, loaded, tokenize, writer, num_proc) -> dict:
    tokenized, natural = [], {}
    for spec, ds in zip(specs, loaded):
        procs = max(1, min(num_proc, len(ds) // args.batch_size))
        tok = ds.with_format("arrow").map(
            tokenize,
            batched=True,
            batch_size=args.batch_size,
            num_proc=procs if procs > 1 else None,
            remove_columns=["text"],
            desc=f"tokenizing {spec.name}",
        )
        tokenized.append(tok.with_format(None))
        natural[spec.name] = int(np.asarray(tok.data.column("num_tokens")).sum())
    try:
        mult = mixture_multipliers(
            natural, {s.name: s.weight for s in specs}, {s.name: s.repeat for s in specs}, args.total_tokens
        )
    except ValueError as err:
        raise RecipeError(str(err)) from None
    rng = np.random.default_rng(args.seed)
    parts, offset, used = [], 0, {}
    for spec, tok in zip(specs, tokenized):
        idx = repeat_indices(len(tok), mult[spec.name], rng)
        lengths = np.asarray(tok.data.column("num_tokens"))
        used[spec.name] = int(lengths[idx].sum())
        parts.append(idx + offset)
        offset += len(tok)
    order = np.concatenate(parts)
    rng.shuffle(order)
    combined = datasets.concatenate_datasets(tokenized)
    # private: datasets has no public "has an indices mapping" query [test_private_apis]
    if combined._indices is not None:  # only then does the Arrow table differ from the rows (a copy otherwise)
        combined = combined.flatten_indices()
    with tqdm(total=len(order), desc="packing", unit="doc") as bar:
        write_shuffled(combined, order, writer, progress=bar)
    return {
        name: {"natural": natural[name], "used": used[name], "multiplier": round(mult[name], 6)} for name in natural
    }


def _stream(args, specs, loaded, tokenize, writer) -> dict:
    """Streaming: sources are read as they are downloaded/read, interleaved by weight (document probabilities:
    token shares are not known in advance), shuffled in a buffer, tokenised and packed without an Arrow cache."""
    streams = []
    for i, ds in enumerate(loaded):
        streams.append(ds.map(lambda b, i=i: {"source": [i] * len(b["text"])}, batched=True))
    if len(streams) > 1:
        weights = [s.weight for s in specs]
        if any(w is None for w in weights):
            raise RecipeError("streaming with several sources: give every source a 'weight'")
        probs = [w / sum(weights) for w in weights]
        mixed = datasets.interleave_datasets(
            streams, probabilities=probs, seed=args.seed, stopping_strategy="all_exhausted"
        )
    else:
        mixed = streams[0]
    mixed = mixed.shuffle(seed=args.seed, buffer_size=args.shuffle_buffer)
    mixed = mixed.with_format("arrow").map(
        lambda b: tokenize(b).append_column("source", b.column("source")), batched=True, batch_size=args.batch_size
    )
    used = [0] * len(specs)
    try:
        _drain(mixed, args, writer, used)
    except RecipeError:
        raise
    except Exception as err:  # a bad line deep in a streamed file: name it if it is a local jsonl
        if (cause := environment_cause(err)) is not None:  # a full disk is the machine, not the data
            raise cause from None
        files = [f for s in specs if s.path and (f := local_files(s))]
        problem = find_bad_json_line([p for group in files for p in group])
        raise RecipeError(problem or f"streaming the sources failed: {err}") from None
    return {s.name: {"used": used[i]} for i, s in enumerate(specs)}


def _drain(mixed, args, writer, used) -> None:
    with tqdm(desc="tokenizing+packing (streaming)", unit="tok", unit_scale=True) as bar:
        for batch in mixed.iter(batch_size=args.batch_size):  # Arrow tables (the stream is Arrow-formatted)
            flat = batch.column("input_ids").combine_chunks().flatten().to_numpy(zero_copy_only=False)
            for src, n in zip(batch.column("source").to_pylist(), batch.column("num_tokens").to_pylist()):
                used[src] += n
            writer.add(flat)
            bar.update(len(flat))
            if args.max_tokens and writer.tokens_in >= args.max_tokens:
                break


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/prepare_data.py`: parse the recipe (CLI flags override), then `prepare`; the exit status."""
    (args,) = parse_recipe([PrepareArguments], argv)
    setup_logging()
    if args.status:
        print("\n".join(task_status(args)))
        return 0
    prepare(args)
    return 0
