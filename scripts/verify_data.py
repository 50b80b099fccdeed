"""Check token files in full against the checksums their manifests record, once, and remember the result.

    python scripts/verify_data.py --data_paths runs/data/token_files.txt --data_root runs/data [--workers 16]
    python scripts/verify_data.py --folders runs/data/math/tulu_math

`pretrain --data_paths` and a re-run of `prepare_data` hash files in full at start only up to a budget (2 GiB); this
hashes all of them (in parallel), and caches each result by the file's inode, size and times, so that later starts
re-read sampled blocks only (instella_recipes/data/integrity.py; the cost at stage 1's scale: benchmarks/RESULTS.md).
"""

try:
    from instella_recipes.data.verify_data import main
except ModuleNotFoundError as missing:  # a Python without the project (outside .venv): one line, not a traceback
    import sys

    print(
        f"error: {sys.executable} cannot import {missing.name}: run it with the project's environment "
        f"(. .venv/bin/activate first, or .venv/bin/python {sys.argv[0]}; make setup creates .venv)",
        file=sys.stderr,
    )
    raise SystemExit(2) from None

if __name__ == "__main__":
    raise SystemExit(main())
