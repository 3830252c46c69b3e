# The two commands a newcomer needs: `make run` and `make test`. Both bootstrap .venv on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
SCENARIO ?= demo

.PHONY: run test lint unit integration e2e controlplane proto proto-check bench bench-quick clean

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/periscope up --scenario $(SCENARIO)

# The suite runs test files in parallel (pytest-xdist): much of its time is real-time scenarios waiting.
# One file stays on one worker (its module and session fixtures start once there); files go out in
# tests/conftest.py's order, the long tiers first, end-to-end files in two lanes. 3 workers on 2 cores:
# 12-12.5 minutes against 30-34 serially (README). PYTEST_WORKERS=0 runs it serially in one process.
# The slowest tests are listed at the end: the suite is to stay under 15 minutes.
PYTEST_WORKERS ?= 3
XDIST = -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

test: $(STAMP) lint controlplane
	$(BIN)/python -m pytest -q -p no:cacheprovider --durations=15 $(XDIST) tests

lint: $(STAMP)
	$(BIN)/ruff check periscope services tests bench
	$(BIN)/mypy --strict periscope/core services/kube_watcher/mappers.py
	$(BIN)/mypy periscope services
	$(BIN)/lint-imports

# The real-apiserver tier's control plane (devkit/controlplane: etcd + kube-apiserver, built from source
# with Go into ~/.cache/periscope/, once; about 13 minutes cold on 2 cores, seconds when cached).
# Without Go the tier skips with that reason; a failing build fails here.
controlplane: $(STAMP)
	@$(BIN)/python -m periscope.sim.controlplane --build-only >/dev/null; rc=$$?; \
	if [ $$rc -eq 2 ]; then echo "make: no Go toolchain: the real-apiserver tier (tests/controlplane) will skip"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit

integration: $(STAMP)
	$(BIN)/python -m pytest -q tests/integration

e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

# Regenerate protobuf/gRPC code and typed stubs from protos/ (committed; a test fails when stale).
proto: $(STAMP)
	$(BIN)/python -m periscope.schema.generate

bench: $(STAMP)
	$(BIN)/python bench/run.py
	$(BIN)/python bench/run.py --readme

bench-quick: $(STAMP)
	$(BIN)/python bench/run.py --quick --out bench/results-quick.json

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
