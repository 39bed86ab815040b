# Two commands for a fresh machine:
#   make train   set up .venv, then train the quickstart model on the built-in dataset
#   make test    set up .venv with test extras, then run lint, the strict docs build and the whole test suite
# CPU installs pin torch through constraints-cpu.txt so pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
VENV ?= .venv
PIP := $(VENV)/bin/pip
CONSTRAINTS ?= constraints-cpu.txt
RUN_DIR ?= outputs/quickstart
SITE_DIR ?= site

.PHONY: train test lint docs format clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(VENV)/.installed: $(VENV)/bin/python pyproject.toml $(CONSTRAINTS)
	$(PIP) install --quiet -c $(CONSTRAINTS) -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(PIP) install --quiet -c $(CONSTRAINTS) -e '.[test]'
	touch $@

train: $(VENV)/.installed
	$(VENV)/bin/anemo-train --config-name=quickstart hydra.run.dir=$(RUN_DIR)

# the whole suite in two pytest-xdist workers (one per core, a test file each at a time) with one torch thread
# each, then the equivalence tests again alone with torch's default threads: a tolerance that holds for one thread
# count only fails here
test: $(VENV)/.installed-test lint docs
	OMP_NUM_THREADS=1 $(VENV)/bin/python -m pytest -q -n 2 --dist loadfile --durations=25
	$(VENV)/bin/python -m pytest -q -m equivalence

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check src tests benchmarks docs
	$(VENV)/bin/ruff format --check src tests benchmarks docs

# the documentation site (mkdocs.yml); --strict: a broken link or any other warning fails (no --quiet: it would
# hide the warnings from --strict too)
docs: $(VENV)/.installed-test
	$(VENV)/bin/mkdocs build --strict --site-dir $(SITE_DIR)

format: $(VENV)/.installed-test
	$(VENV)/bin/ruff check --fix src tests benchmarks docs
	$(VENV)/bin/ruff format src tests benchmarks docs

clean:
	rm -rf $(VENV) outputs build dist $(SITE_DIR)

# GPU proof kit (docs/gpu.md). gpu-wheels: on a machine with the package registries, the wheels an offline CUDA
# machine lacks, into .gpu-wheels/ (carried with the working tree, < 64 MiB in all). gpu-check: on the CUDA machine,
# installs them into a scratch folder (not the machine's environment) and writes gpu_report.md / .json into $(GPU_OUT).
GPU_PYTHON ?= python3
GPU_OUT ?= $(if $(OUT),$(OUT),outputs/gpu-check)
.PHONY: gpu-wheels gpu-check

gpu-wheels: $(VENV)/.installed-test
	$(VENV)/bin/python benchmarks/gpu/gpu_wheels.py --out .gpu-wheels

gpu-check:
	$(GPU_PYTHON) benchmarks/gpu/gpu_check.py --wheels .gpu-wheels --out $(GPU_OUT)
