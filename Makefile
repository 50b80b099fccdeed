# Two commands on a fresh machine: `make demo` (the tiny end-to-end pipeline on CPU) and `make test`.
# Both create .venv, install torch first (TORCH_SPEC, the CPU wheel here; on GPU nodes set TORCH_SPEC to your
# CUDA/ROCm build) so that no other package pulls a CUDA torch, then the project with the tested constraints.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint format clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: setup
	$(PY) recipes/pipeline.py --config recipes/tiny/pipeline.yaml

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) runs .pytest_cache
