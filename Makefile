# Every target creates or refreshes .venv, so each works on a fresh machine.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow install clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: the team's machines carry a local CPU wheel of exactly this version.
	$(BIN)/python -m pip install -q "torch==2.13.0"
	# the pos extra (spaCy's English small model, DTCA docs/spec.md §3.1) so that its tests run too
	$(BIN)/python -m pip install -q -e ".[dev,pos]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	# --overwrite: a re-run replaces the previous demo run in runs/demo (the SFT cache is kept)
	$(BIN)/maskrl demo --config configs/demo_sudoku.yaml --overwrite

# The default suite (within 15 minutes on a quiet 2-core machine: docs/testing.md): everything but the
# tests marked `slow`. Second pass: the float-tolerance tests (marker `numerics`) under another CPU
# kernel set and thread count, so that a tolerance that holds only for this machine's AVX2 / AVX-512
# kernels fails here.
test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" tests
	ATEN_CPU_CAPABILITY=default MASKRL_TEST_THREADS=2 $(BIN)/python -m pytest -q -m "numerics and not slow" tests

# The heavier tests (marker `slow`: several processes, real-width stand-ins, the table's cells): CI's
# second stage (.ci/run).
test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow tests

clean:
	rm -rf $(VENV) runs .pytest_cache
