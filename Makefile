# One interface for humans and CI. `make demo` and `make test` bootstrap everything they need.
.DEFAULT_GOAL := test
.PHONY: install proto proto-check lint format typecheck test test-unit test-integration test-e2e conformance demo bench clean

VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
GEN := procmesh/v1
HEADER := """Generated from proto/procmesh/v1 by `make proto`; do not edit."""
protoc = PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto --python_out=$(1) \
         --grpc_python_out=$(1) --mypy_out=$(1) --mypy_grpc_out=$(1) $(wildcard proto/procmesh/v1/*.proto)

$(STAMP): pyproject.toml sdk/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e sdk -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

proto: $(STAMP)
	rm -rf sdk/$(GEN) && $(call protoc,sdk) >/dev/null && echo '$(HEADER)' > sdk/$(GEN)/__init__.py

proto-check: $(STAMP)
	t=$$(mktemp -d) && $(call protoc,$$t) >/dev/null && echo '$(HEADER)' > $$t/$(GEN)/__init__.py \
	  && diff -r $$t/$(GEN) sdk/$(GEN) && echo "proto-check: generated code matches proto/"

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff check --fix . && $(BIN)/ruff format .

typecheck: $(STAMP)
	$(BIN)/mypy

test-unit: $(STAMP)
	$(BIN)/pytest tests/unit -q

test-integration: $(STAMP)
	$(BIN)/pytest tests/integration -q

test-e2e: $(STAMP)
	$(BIN)/pytest tests/e2e -q

# Everything CI checks: lint, types, proto drift, every test tier (conformance included).
test: lint typecheck proto-check
	$(BIN)/pytest -q

conformance: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH python3 ../shared/conformance/compare.py \
	  --dir ../shared/conformance/scenarios --runner "procmesh scenario run"

demo: $(STAMP)
	$(BIN)/procmesh demo

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
