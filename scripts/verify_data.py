"""Check token files in full against the checksums their manifests record, once, and remember the result.

    python scripts/verify_data.py --data_paths runs/data/token_files.txt --data_root runs/data [--workers 16]
    python scripts/verify_data.py --folders runs/data/math/tulu_math

`pretrain --data_paths` and a re-run of `prepare_data` hash files in full at start only up to a budget (2 GiB); this
hashes all of them (in parallel), and caches each result by the file's inode, size and times, so that later starts
re-read sampled blocks only (instella_recipes/data/integrity.py; the cost at stage 1's scale: benchmarks/RESULTS.md).
"""

from instella_recipes.data.verify_data import main

if __name__ == "__main__":
    raise SystemExit(main())
