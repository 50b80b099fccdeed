"""`scripts/verify_data.py`: every token file checked in full against the checksum its manifest records, in parallel,
and the result cached so that later starts of `pretrain --data_paths` and `prepare_data` check sampled blocks only
(`integrity.py` says how the checks scale)."""

import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from instella_recipes.core import (
    MANIFEST,
    RecipeError,
    check_range,
    exit_on_recipe_error,
    get_logger,
    parse_recipe,
    read_manifest,
    setup_logging,
    verify_files,
)
from instella_recipes.core.manifest import HASH
from instella_recipes.data.integrity import Checked, VerifiedCache, verify_contents
from instella_recipes.data.token_files import check_against_manifests, read_path_list

logger = get_logger(__name__)


@dataclass
class VerifyDataArguments:
    """The settings of `scripts/verify_data.py`."""

    data_paths: list[str] = field(default_factory=list, metadata={"help": "Token files, or one .txt list of them."})
    data_root: str | None = field(default=None, metadata={"help": "Folder that relative data_paths entries are in."})
    folders: list[str] = field(default_factory=list, metadata={"help": "prepare_data output folders to check."})
    workers: int = field(default=os.cpu_count() or 1, metadata={"help": "Processes hashing files in parallel."})

    def __post_init__(self):
        check_range("workers", self.workers, 1, integer=True)
        if not self.data_paths and not self.folders:
            raise RecipeError("nothing to verify: give data_paths (token files or a .txt list) or folders")


def _folder_items(folder: Path) -> list[Checked]:
    manifest = read_manifest(folder)
    if manifest is None:
        raise RecipeError(f"folders: {folder} has no {MANIFEST}, so nothing records what its files should hold")
    verify_files(folder, manifest, "folder", hash_bytes=0)
    listed = (manifest.get("integrity") or {}).get("files") or {}
    redo = f"run the '{manifest.get('stage', '?')}' stage again with --overwrite true"
    return [
        Checked(folder / name, f"folder {folder}: {name}", entry.get(HASH), redo) for name, entry in listed.items()
    ]


@exit_on_recipe_error
def main(argv: list[str] | None = None) -> int:
    """`scripts/verify_data.py`: hash every file the manifests beside `data_paths` (or in `folders`) record, compare
    with the recorded checksums and fill the cache that later starts check sampled blocks against; exit 2 naming
    the first file that differs."""
    (args,) = parse_recipe([VerifyDataArguments], argv)
    setup_logging()
    items: list[Checked] = []
    for folder in args.folders:
        items += _folder_items(Path(folder))
    if args.data_paths:
        paths = read_path_list(args.data_paths, args.data_root, verify=False)[1]
        items += check_against_manifests([(path, f"token file {path}") for path in paths])
    recorded = [i for i in items if i.digest]
    size = sum(i.path.stat().st_size for i in recorded)
    start = time.perf_counter()
    verify_contents(recorded, budget=size, cache=VerifiedCache(), workers=args.workers)
    seconds = time.perf_counter() - start
    logger.info(
        f"verify_data: {len(recorded)} files ({size / 2**30:.2f} GiB) match their recorded checksums "
        f"({seconds:.1f} s, {size / 2**30 / max(seconds, 1e-9):.2f} GiB/s); {len(items) - len(recorded)} files had "
        f"none recorded"
    )
    return 0
