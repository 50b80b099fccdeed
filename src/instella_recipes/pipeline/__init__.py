"""The pipeline engine behind `scripts/pipeline.py`: a stage graph read from YAML (`graph`), run stage by stage as
subprocesses with logs, progress, skip-when-complete and clear failures (`runner`)."""
