"""One synthetic GSM8K run: read the seeds, resume from the journals, generate, write the dataset and a summary.

Output folder:
- `journal/<seed_id>.jsonl`: per-seed append-only step records (the run's state; see journal.py),
- `run_config.json`: the settings that decide the results; a resumed run must match it,
- `<split>.parquet` (or `.jsonl`) and one file per extra split (`train_119K` = a seeded random subset),
- `summary.json`, then `manifest.json` last.

The output-folder rule of `core.io`: a folder holding a complete output (a manifest, of this stage or any other) is
written into only with `--overwrite`, and its manifest goes first. With the same result-deciding settings the
journals are kept, so the finished seeds are not generated again (a grown `max_seeds`, or seeds a backend outage left
undone, are the only new work); a complete output of another stage, or journals made with other settings, are
removed and the run starts anew. A folder without a manifest is an interrupted run and resumes without the flag.
"""

import contextlib
import fcntl
import hashlib
import json
import random
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from tqdm.auto import tqdm

from instella_recipes.core import (
    RecipeError,
    atomic_file,
    atomic_write_text,
    check_output_dir,
    check_output_location,
    check_positive,
    check_range,
    complete_stage,
    empty_folder,
    exit_on_recipe_error,
    parse_recipe,
    retract_manifest,
    setup_logging,
    write_manifest,
)
from instella_recipes.sandbox import SandboxConfig, SandboxPool, SandboxUnavailable
from instella_recipes.sandbox.uids import UID_BLOCK

from .backends import Backend, make_backend
from .journal import Journal
from .parsing import Rejected, parse_seed
from .pipeline import Generator, GeneratorArguments, SeedState, replay, samples

STAGE = "synthetic_gsm8k"


@dataclass
class SyntheticGSM8KArguments:
    """Recipe fields of `scripts/synthetic_gsm8k.py` (one YAML = one run; CLI flags override)."""

    seeds: str = field(default="", metadata={"help": "GSM8K-format jsonl/parquet path, or a Hub dataset id"})
    seeds_split: str = field(default="train", metadata={"help": "split to read when `seeds` is a Hub id"})
    seeds_config: str | None = field(default=None, metadata={"help": "Hub dataset config (openai/gsm8k: main)"})
    max_seeds: int | None = field(default=None, metadata={"help": "use only the first N seed rows"})
    output_dir: str = field(default="runs/synthetic_gsm8k", metadata={"help": "journals, dataset, summary"})
    output_format: str = field(default="parquet", metadata={"help": "parquet or jsonl"})
    split: str = field(default="train", metadata={"help": "name of the full split file"})
    extra_splits: list[str] = field(
        default_factory=list, metadata={"help": "'name:count' seeded random subsets, e.g. train_119K:119000"}
    )
    backend: str = field(default="openai", metadata={"help": "openai (any compatible HTTP server) or transformers"})
    model: str = field(default="", metadata={"help": "model name on the server, or a local path / Hub id"})
    base_url: str = field(default="http://127.0.0.1:8000/v1", metadata={"help": "OpenAI-compatible server URL"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "environment variable with the API key"})
    max_concurrency: int = field(default=32, metadata={"help": "HTTP requests in flight at once"})
    batch_size: int = field(default=8, metadata={"help": "prompts per generate() call (transformers backend)"})
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "transformers backend: run the model folder's own code (not needed for Instella folders)"},
    )
    request_timeout: float = field(default=600.0, metadata={"help": "seconds per HTTP request"})
    max_retries: int = field(default=3, metadata={"help": "retries per HTTP request (429, 5xx, connection)"})
    max_backend_error_fraction: float = field(
        default=0.0,
        metadata={
            "help": "share of seed problems a run may leave undone for backend errors (the next run, with --overwrite "
            "true, retries them) and still write its dataset; above it (or with nothing kept) the run fails without "
            "a manifest"
        },
    )
    max_program_rounds: int = 3
    num_variants: int = 5
    target_per_seed: int = 20
    cot_samples_per_request: int = 8
    max_cot_rounds: int = 4
    rewrite: str = field(default="model", metadata={"help": "model (as published) or template"})
    natural_answers_only: bool = True
    temperature: float = 0.7
    cot_temperature: float = 0.8
    max_tokens: int = 1024
    chunk_size: int = field(default=64, metadata={"help": "seed problems advanced together (one batch per step)"})
    seed: int = 1234
    sandbox: str = field(default="bwrap", metadata={"help": "bwrap (isolated) or rlimits-only (WEAKER, opt-in)"})
    sandbox_workers: int = 4
    program_timeout: float = field(default=30.0, metadata={"help": "wall and CPU seconds per program (published)"})
    program_memory_mb: int = 1024
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "write into an output_dir holding a complete output (its manifest removed first): a finished run "
            "of the same settings goes on from its journals (finished seeds kept), anything else is emptied first"
        },
    )

    def __post_init__(self):
        if self.output_format not in ("parquet", "jsonl"):
            raise ValueError(f"output_format must be parquet or jsonl, got {self.output_format!r}")
        if self.rewrite not in ("model", "template"):
            raise ValueError(f"rewrite must be model or template, got {self.rewrite!r}")
        if self.sandbox not in ("bwrap", "rlimits-only"):
            raise ValueError(f"sandbox must be bwrap or rlimits-only, got {self.sandbox!r}")
        for spec in self.extra_splits:
            name, _, count = spec.partition(":")
            if not name or not count.isdigit():
                raise ValueError(f"extra_splits entry {spec!r} must look like 'name:count' (e.g. train_119K:119000)")
        self._check_numbers()

    def _check_numbers(self) -> None:
        check_positive(self, "max_concurrency", "batch_size", "max_program_rounds", "num_variants", "target_per_seed")
        check_positive(self, "cot_samples_per_request", "max_cot_rounds", "max_tokens", "chunk_size")
        check_range(
            "sandbox_workers", self.sandbox_workers, 1, UID_BLOCK, integer=True, hint="sandboxed programs run at once"
        )
        check_range("program_memory_mb", self.program_memory_mb, 1, integer=True, hint="memory per program, MiB")
        check_range("program_timeout", self.program_timeout, 0, low_open=True, hint="seconds per program")
        check_range("request_timeout", self.request_timeout, 0, low_open=True, hint="seconds per HTTP request")
        check_range("max_retries", self.max_retries, 0, integer=True)
        check_range("max_seeds", self.max_seeds, 1, integer=True, allow_none=True)
        check_range("max_backend_error_fraction", self.max_backend_error_fraction, 0, 1)
        check_range("temperature", self.temperature, 0)
        check_range("cot_temperature", self.cot_temperature, 0)

    def settings(self) -> GeneratorArguments:
        return GeneratorArguments(**{f.name: getattr(self, f.name) for f in fields(GeneratorArguments)})

    def sandbox_config(self) -> SandboxConfig:
        return SandboxConfig(
            mode=self.sandbox,
            workers=self.sandbox_workers,
            wall_seconds=self.program_timeout,
            cpu_seconds=self.program_timeout,
            memory_mb=self.program_memory_mb,
        )


class BackendFailed(RuntimeError):
    """The model server failed too often for the run to count: nothing is written but the journals (a re-run retries
    the seeds it left undone). The entry point prints it and exits 1."""


class NothingSolved(RuntimeError):
    """Every seed problem was tried and none was solved (the model's replies were all rejected): an empty dataset is
    no output, so nothing is written but the journals. The entry point prints it and exits 1."""


def _check_solved(states: list, seed_rejections: Counter) -> None:
    """Raise `NothingSolved`, naming the most common rejections, when no seed problem was solved."""
    if any(s.status == "solved" for s in states):
        return
    rejections = Counter(seed_rejections)
    for state in states:
        rejections.update(state.rejections)
    top = ", ".join(f"{reason} {count}" for reason, count in rejections.most_common(3)) or "none recorded"
    raise NothingSolved(
        f"no seed problem was solved ({len(states)} tried; most common rejections: {top}), so there is no dataset "
        f"and no manifest: check the model and its server (a model this small or this wrong answers nothing usable), "
        f"then run again into a new output_dir (or with --overwrite true: the journals keep these rejections)"
    )


def _check_backend(deferred: dict[str, str], states: list, max_fraction: float) -> None:
    """Raise `BackendFailed` (with the first error's text) when backend errors left more than `max_fraction` of the
    seed problems undone, or left no seed solved."""
    if not deferred:
        return
    lost = len(deferred) / max(1, len(states))
    solved = sum(s.status == "solved" for s in states)
    if lost > max_fraction or solved == 0:
        first = next(iter(deferred.values()))
        raise BackendFailed(
            f"the model server failed for {len(deferred)} of {len(states)} seed problems ({lost:.1%} > "
            f"max_backend_error_fraction {max_fraction}) after its retries; first error: {first}. Nothing was "
            f"written but the journals: fix the server and run the same command again to retry them"
        )


def read_seeds(source: str, split: str = "train", max_rows: int | None = None, name: str | None = None) -> list[dict]:
    """GSM8K rows from a local .jsonl/.json/.parquet file or a Hub dataset id (through `datasets`)."""

    path = Path(source)
    if not source:
        raise RecipeError("`seeds` is empty: give a GSM8K-format jsonl/parquet path or a Hub dataset id")
    if path.suffix in (".jsonl", ".json") and path.is_file():
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                row = {"_unparsable_line": number}
            rows.append(row if isinstance(row, dict) else {"_unparsable_line": number})
    elif path.suffix == ".parquet" and path.is_file():
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.exists():
        raise RecipeError(f"seeds file {path}: expected .jsonl, .json or .parquet")
    elif path.suffix in (".jsonl", ".json", ".parquet") or source.startswith((".", "/")):
        raise RecipeError(f"seeds file {path} does not exist (give a GSM8K-format jsonl/parquet file or a Hub id)")
    else:
        try:
            import datasets

            rows = list(datasets.load_dataset(source, name, split=split))
        except Exception as err:
            raise RecipeError(f"seeds {source!r} is neither a local file nor a loadable Hub dataset: {err}") from None
    return rows[:max_rows] if max_rows else rows


def _seed_states(rows: list[dict], counts: Counter) -> list[SeedState]:
    states = []
    for index, row in enumerate(rows):
        seed_id = f"seed-{index:06d}"
        try:
            question, gold = parse_seed(row)
        except Rejected as err:
            counts[err.reason] += 1
            continue
        states.append(SeedState(seed_id=seed_id, question=question, gold=gold))
    return states


def _changed_settings(output_dir: Path, config: dict) -> list[str]:
    """The result-deciding settings in which the run in `output_dir` (its `run_config.json`) differs from `config`."""
    path = output_dir / "run_config.json"
    if not path.is_file():
        return []
    previous = json.loads(path.read_text())
    return sorted(k for k in set(previous) | set(config) if previous.get(k) != config.get(k))


def _claim(output_dir: Path, config: dict, done: dict | None, overwrite: bool) -> None:
    """Make `output_dir` this run's (the lock held): the rule of `core.io` (see the module docstring)."""
    changed = _changed_settings(output_dir, config)
    if changed and not overwrite:
        raise RecipeError(
            f"{output_dir} holds a run made with different settings ({', '.join(changed)}): resume with the same "
            f"settings, choose a new output_dir, or pass --overwrite true to start it anew"
        )
    if overwrite and (changed or (done is not None and done["stage"] != STAGE)):
        retract_manifest(output_dir)  # first: a kill during the removal leaves nothing complete-looking
        empty_folder(output_dir, keep=[".lock"])  # the lock this run holds stays
    else:
        retract_manifest(output_dir)  # this same run goes on (or grows): its dataset is rewritten, manifest last
    if not (output_dir / "run_config.json").is_file():
        atomic_write_text(output_dir / "run_config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")


def _schema():
    """The published `messages` column plus provenance; explicit so that an empty split has the same columns."""
    import pyarrow as pa

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("messages", pa.list_(message)),
            ("seed_id", pa.string()),
            ("variant", pa.int64()),
            ("parameters", pa.string()),
            ("answer", pa.string()),
            ("program_sha256", pa.string()),
        ]
    )


def _write_rows(rows: list[dict], path: Path, fmt: str) -> None:
    """Write aside, then rename: a file with the final name is always complete."""
    if fmt == "jsonl":
        with atomic_file(path) as handle:
            handle.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        with atomic_file(path, "wb") as handle:
            pq.write_table(pa.Table.from_pylist(rows, schema=_schema()), handle)


def dedup(rows: list[dict]) -> tuple[list[dict], int]:
    """Drop repeated (question, solution) pairs across the whole dataset (different seeds can meet)."""
    seen, out = set(), []
    for row in rows:
        key = tuple(" ".join(m["content"].split()).lower() for m in row["messages"])
        if key not in seen:
            seen.add(key)
            out.append(row)
    return out, len(rows) - len(out)


# Settings a resumed run may change: speed, file layout, and how many seed rows to use (growing a run keeps the
# finished seeds), not what a given seed problem yields.
_NOT_RESULT_DECIDING = (
    "output_dir", "max_concurrency", "batch_size", "request_timeout", "max_retries", "sandbox_workers",
    "extra_splits", "output_format", "split", "max_seeds", "max_backend_error_fraction", "trust_remote_code",
    "overwrite",
)  # fmt: skip


def run(args: SyntheticGSM8KArguments, backend: Backend | None = None, pool: SandboxPool | None = None) -> dict:
    """Run (or resume) the pipeline; returns the summary. `backend`/`pool` are injectable for tests."""
    output_dir = check_output_location(args.output_dir)
    done = complete_stage(output_dir)
    if done is not None:  # a complete output of any stage, this one's too: only with --overwrite (core.io's rule)
        check_output_dir(output_dir, args.overwrite)
    rows = read_seeds(args.seeds, args.seeds_split, args.max_seeds, args.seeds_config)
    seed_rejections: Counter = Counter()
    states = _seed_states(rows, seed_rejections)
    config = {k: v for k, v in asdict(args).items() if k not in _NOT_RESULT_DECIDING}
    if Path(args.seeds).is_file():  # the same path with other content is another run
        config["seeds_sha256"] = hashlib.sha256(Path(args.seeds).read_bytes()).hexdigest()
    output_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(output_dir):
        _claim(output_dir, config, done, args.overwrite)
        return _run_locked(args, output_dir, states, seed_rejections, len(rows), backend, pool)


@contextlib.contextmanager
def _exclusive(output_dir: Path):
    """One run per output folder: two runs appending to the same journals would duplicate work."""

    with open(output_dir / ".lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RecipeError(f"another run is using {output_dir} (it holds {output_dir / '.lock'})") from None
        yield


def _run_locked(args, output_dir, states, seed_rejections, n_rows, backend, pool) -> dict:
    journal = Journal(output_dir / "journal")
    for state in states:
        replay(state, journal.read(state.seed_id))
    if any(s.status is None for s in states):
        own_pool = pool is None
        if own_pool:  # before any generation: fail closed without the sandbox
            try:
                pool = SandboxPool(args.sandbox_config())
            except SandboxUnavailable as err:
                raise RecipeError(str(err)) from None
        try:
            backend = backend or make_backend(
                args.backend, args.model, args.base_url, args.api_key_env, args.max_concurrency, args.batch_size,
                args.request_timeout, args.max_retries, args.trust_remote_code,
            )  # fmt: skip
            done = sum(s.status is not None for s in states)
            generator = Generator(backend, pool, journal, args.settings())
            with tqdm(total=len(states), initial=done, desc="seed problems", unit="seed", file=sys.stderr) as bar:
                generator.run(states, bar)
        finally:
            if own_pool:
                pool.close()
        _check_backend(generator.deferred, states, args.max_backend_error_fraction)
    _check_solved(states, seed_rejections)
    return finish(args, output_dir, states, seed_rejections, n_rows)


def finish(
    args: SyntheticGSM8KArguments, output_dir: Path, states: list[SeedState], seed_rejections: Counter, n_rows: int
):
    all_rows = [row for state in states if state.status == "solved" for row in samples(state)]
    rows, duplicates = dedup(all_rows)
    suffix = ".parquet" if args.output_format == "parquet" else ".jsonl"
    files = {args.split: len(rows)}
    _write_rows(rows, output_dir / f"{args.split}{suffix}", args.output_format)
    for spec in args.extra_splits:
        name, _, count = spec.partition(":")
        subset = sorted(random.Random(args.seed).sample(range(len(rows)), min(int(count), len(rows))))
        _write_rows([rows[i] for i in subset], output_dir / f"{name}{suffix}", args.output_format)
        files[name] = len(subset)
    rejections = Counter(seed_rejections)
    for state in states:
        rejections.update(state.rejections)
    if duplicates:
        rejections["duplicate_sample"] += duplicates
    summary = {
        "seed_rows": n_rows,
        "seed_problems": len(states),
        "seed_problems_solved": sum(s.status == "solved" for s in states),
        "programs_verified": sum(s.program is not None for s in states),
        "variants": sum(len(s.variants or []) for s in states),
        "samples_kept": len(rows),
        "seed_problems_left_for_backend_errors": sum(s.status is None for s in states),
        "splits": files,
        "rejections": dict(sorted(rejections.items())),
    }
    atomic_write_text(output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    write_manifest(output_dir, STAGE, recipe=asdict(args), summary=summary)
    return summary


def format_summary(summary: dict) -> str:
    lines = [
        f"seed problems solved: {summary['seed_problems_solved']} / {summary['seed_problems']} "
        f"({summary['seed_rows'] - summary['seed_problems']} malformed seed rows)",
        f"programs verified:    {summary['programs_verified']}",
        f"variants:             {summary['variants']}",
        f"samples kept:         {summary['samples_kept']}  "
        + ", ".join(f"{k}={v}" for k, v in summary["splits"].items()),
        "rejections:",
    ]
    lines += [f"  {reason:<28} {count}" for reason, count in summary["rejections"].items()] or ["  (none)"]
    return "\n".join(lines)


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/synthetic_gsm8k.py`: exit 0 done, 2 bad input (before any work), 1 the model server failed too often
    (the same command retries the seeds it left undone) or no seed problem was solved (no dataset)."""
    (args,) = parse_recipe([SyntheticGSM8KArguments], argv)
    setup_logging()
    try:
        summary = run(args)
    except (BackendFailed, NothingSolved) as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    print(format_summary(summary))
    return 0
