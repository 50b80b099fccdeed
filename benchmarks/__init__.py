"""Side-by-side performance scripts; each writes benchmarks/results/<name>.md and refreshes RESULTS.md."""
