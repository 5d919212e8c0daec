# psrv: `make run` sets up and runs the default job; `make test` sets up and runs the tests.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
TORCH   ?= torch==2.13.0
STAMP   := $(VENV)/.installed
# Test processes: two more pytest workers than cores (4 on CI's 2), since a good part of each worker's time is
# waiting (a run's processes starting, fault timeouts, emulated compute): on fresh clones of 2 quiet cores the suite
# took 9 min 58 s and 10 min 14 s in 4 workers against 11 min 31 s and 12 min 23 s in 3 the same day
# (docs/architecture.md, "The test suite"). A test file stays on one worker (its module fixtures), and the longest
# files go out first (tests/file_durations.py; --no-loadscope-reorder keeps that order). TEST_JOBS=0 runs them in
# this process.
TEST_JOBS ?= $(shell echo $$(( $$(nproc) + 2 )))

.PHONY: run test bench bench-smoke chaos gpu-check gpu-prepare mutants setup clean

setup: $(STAMP)

# --no-compile: pip would compile every module of torch and of the test extras (about 15 s of a fresh set-up here),
# most of which no psrv process imports; one import of what psrv's processes use, with bytecode writing on, compiles
# those (about 3 s), and anything else compiles on its first import.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --no-compile "$(TORCH)"
	$(BIN)/pip install -q --no-compile -e ".[test]"
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m psrv.cli.precompile
	touch $(STAMP)

run: setup
	$(BIN)/psrv run --out runs/default

# The tests' processes start psrv (and pytest rewrites the test files) hundreds of times: with bytecode writing on, each
# module is compiled once, where PYTHONDONTWRITEBYTECODE in the caller's environment would compile it in every process.
test: setup
	$(BIN)/lint-imports --no-cache
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder --durations=15

# The peers bench runs Ray's parameter-server example beside psrv: Ray is installed for it here, not by setup.
bench: setup
	$(BIN)/python -c "import ray" 2>/dev/null || $(BIN)/pip install -q --no-compile -e ".[test,peers]"
	$(BIN)/python -m psrv.experiments.bench

bench-smoke: setup
	$(BIN)/python -m psrv.experiments.bench --smoke

# A long run under a seeded nemesis against its fault-free baseline (about 30 minutes; not in `make test` or
# `make bench`): faults by kind and target, the history checker's verdict, goodput. CHAOS_ARGS="--minutes 3": short.
chaos: setup
	$(BIN)/python -m psrv.experiments.bench.chaos $(CHAOS_ARGS)

# psrv's GPU paths measured on a machine with CUDA (about 9 minutes; not in `make test` or `make bench`; docs/benchmarks.md,
# "GPU"): the GPU tests, a GPU0 shard's step against a device copy, host<->device copies, GPU workers' samples/s against
# DDP, placement.toml's GPU0 rows, then the whole suite. Without CUDA each GPU part is one SKIPPED line (seconds).
# GPU_CHECK_ARGS="--rehearse": without CUDA, the GPU parts run on the CPU at tiny sizes (their code runs; no GPU figure).
GPU_OUT ?= bench/gpu
gpu-check: setup
	$(BIN)/python -m psrv.experiments.bench.gpu_check --out $(GPU_OUT) $(GPU_CHECK_ARGS)

# Mutation testing (not in `make test`; docs/architecture.md, "Mutation testing"): mutmut, installed here only, over the
# server's rules, optimizers, consistency, pulls, fragments and replication, the codecs and the worker's compression
# state, the conformance matrix in process as the test command (tests/conformance/mutants.py): the score per package,
# the surviving mutants, the equivalent ones (tests/conformance/equivalent_mutants.toml). Hours for all the files;
# MUTANTS_ARGS="--paths psrv/server/rules": some files or folders only; "--resume" after an interruption.
MUTMUT ?= mutmut==3.8.1
mutants: setup
	$(BIN)/pip install -q "$(MUTMUT)"
	$(BIN)/python -m tests.conformance.mutants $(MUTANTS_ARGS)

# The wheels a lent GPU machine lacks, into .whl/ (carried by the device call), and that one call, printed.
gpu-prepare:
	PY=$(PY) deploy/gpu/prepare.sh

clean:
	rm -rf $(VENV) runs build *.egg-info mutants
