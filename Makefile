# The two commands a newcomer needs (see README.md):
#   make demo   - set up .venv on a fresh machine and run the main job on the built-in default
#   make test   - set up .venv and run lint + the whole test suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.truestep-setup
NPROC ?= 2

.PHONY: setup demo test test-fast test-multiprocess test-slurm lint format bench clean

setup: $(STAMP)

# torch==2.13.0 is the CPU wheel on CPU machines; GPU users install their own torch into .venv first
# and this step keeps it (it only installs torch when none is importable).
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The main job: the instrument end to end on the built-in default (runs/demo is recreated each time).
demo: setup
	rm -rf runs/demo
	OMP_NUM_THREADS=1 $(BIN)/truestep demo --out runs/demo

lint: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

# WORKERS=N runs the suite in N pytest-xdist workers (tests that share a session run, a module's
# fixtures or a SLURM cluster stay in one worker: tests/conftest.py groups them). Three on this 2-core
# machine: a third keeps the cores busy while a test waits on a job (fresh clone: 13 min 11 s, two
# workers 14 min 05 s and 14 min 48 s). WORKERS=0 runs it in this process.
WORKERS ?= 3
test: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "" -n $(WORKERS) --dist loadgroup --durations=15

# The test tiers (pyproject.toml markers; README "Tests"): `make test` runs all of them.
FAST := not multiprocess and not slurm and not slow
test-fast: lint
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "$(FAST)" -n 2 --dist load

test-multiprocess: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m "multiprocess and not slurm" -n $(WORKERS) --dist loadgroup

test-slurm: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m slurm -n $(WORKERS) --dist loadgroup

format: setup
	$(BIN)/ruff check --fix src tests benchmarks
	$(BIN)/ruff format src tests benchmarks

bench: setup
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/step_overhead.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/checkpoint_cost.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/recovery.py

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
