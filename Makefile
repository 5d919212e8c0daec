# psrv: `make run` sets up and runs the default job; `make test` sets up and runs the tests.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
# Test processes: most of the suite's time is psrv processes starting (each imports torch), so two
# pytest workers keep both of CI's two cores busy; a test file stays on one (its module fixtures, and
# the emulated hosts' fixed names in tests/system/test_netns.py). TEST_JOBS=0 runs them in this process.
TEST_JOBS ?= 2

.PHONY: run test bench bench-smoke chaos setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	touch $(STAMP)

run: setup
	$(BIN)/psrv run --out runs/default

test: setup
	$(BIN)/python -m tests.lint_layout
	$(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --durations=15

bench: setup
	$(BIN)/python -m psrv.experiments.bench

bench-smoke: setup
	$(BIN)/python -m psrv.experiments.bench --smoke

# A long run under a seeded nemesis against its fault-free baseline (about 30 minutes; not in `make test` or
# `make bench`): faults by kind and target, the history checker's verdict, goodput. CHAOS_ARGS="--minutes 3": short.
chaos: setup
	$(BIN)/python -m psrv.experiments.bench.chaos $(CHAOS_ARGS)

clean:
	rm -rf $(VENV) runs build *.egg-info
