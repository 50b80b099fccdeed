"""The pipeline engine behind `scripts/pipeline.py` (`cli`): a stage graph read from YAML and resolved once per stage
(`graph`), run stage by stage as subprocesses with logs, progress, skip-when-complete and clear failures (`runner`)
or submitted as dependent sbatch jobs (`slurm`), and the report of a run (`report`, `health`)."""
