"""How the models are made: thin entry points (`recipes/*.py`), their shared helpers, and one YAML per run."""
