# Cuty checkout platform. `make run` starts everything; `make test` runs the whole suite.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
GEN := build/gen
PG_BIN ?= /usr/lib/postgresql/15/bin
export PYTHONPATH := $(CURDIR)/$(GEN):$(CURDIR)/libs:$(CURDIR)/services/booking:$(CURDIR)/services/codepool:$(CURDIR)/services/payments:$(CURDIR)/services/gateway:$(CURDIR)/services/pspsim:$(CURDIR)
export CUTY_PG_BIN := $(PG_BIN)

PROTOS := $(shell find protos -name '*.proto')
# Every bench/<name>.py (not the _shared modules) is `make bench-<name>`.
BENCHES := $(patsubst bench/%.py,bench-%,$(filter-out bench/_%,$(wildcard bench/*.py)))

.PHONY: all venv gen pg-check promtool-check run test test-unit test-integration test-e2e soak bench $(BENCHES) demo image clean

all: gen

# Closed lock files: every package pinned with its hashes; pip refuses anything else. The venv's
# own pip (ensurepip's) installs them, so nothing unpinned is fetched.
LOCKS := requirements.lock requirements-build.lock requirements-test.lock
$(VENV)/.installed: $(LOCKS) pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; install Python 3.11 (Debian: apt-get install python3.11 python3.11-venv)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes $(addprefix -r ,$(LOCKS))
	touch $@

venv: $(VENV)/.installed

# Generated code is built, never committed (protos/ keeps folders matching packages; -Iprotos).
$(GEN)/.stamp: $(VENV)/.installed $(PROTOS)
	rm -rf $(GEN) && mkdir -p $(GEN)
	$(PY) -m grpc_tools.protoc -Iprotos \
	  -I$$($(PY) -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))') \
	  -I$$($(PY) -c 'import google.api.annotations_pb2 as m, os; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))') \
	  --python_out=$(GEN) --pyi_out=$(GEN) --grpc_python_out=$(GEN) \
	  --descriptor_set_out=$(GEN)/descriptors.pb --include_imports --include_source_info \
	  $(PROTOS)
	touch $@

# cuty-client (clients/python, docs/clients.md) installed into the venv the way its users install
# it (`pip install ./clients/python`, which builds its protobuf modules from protos/), so the
# example and its e2e test run the package as shipped. The build tools come from the locks.
CLIENT_SRC := $(shell find clients/python -name '*.py' -not -path '*/build/*' -not -path '*/_pb/*') clients/python/pyproject.toml
$(VENV)/.client: $(VENV)/.installed $(PROTOS) $(CLIENT_SRC)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --force-reinstall ./clients/python
	rm -rf clients/python/build
	touch $@

gen: $(GEN)/.stamp $(VENV)/.client

# PostgreSQL server binaries are needed for the embedded cluster and the test cluster.
pg-check:
	@if [ -n "$$CUTY_TEST_DSN$$CUTY_DATABASE_URL" ]; then exit 0; fi; \
	if [ ! -x "$(PG_BIN)/initdb" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "PostgreSQL 15 server not found; installing Debian package postgresql-15"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql-15 >/dev/null; \
	  else \
	    echo "error: PostgreSQL 15 server binaries not found in $(PG_BIN)."; \
	    echo "Install the Debian package 'postgresql-15' (apt-get install postgresql-15), or set CUTY_TEST_DSN / CUTY_DATABASE_URL."; \
	    exit 1; \
	  fi; \
	fi

# promtool (Debian package 'prometheus') unit-tests the alert rules; installed like postgresql-15.
# Where it cannot be installed the rule tests skip, naming what is missing.
promtool-check:
	@if ! command -v promtool >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "promtool not found; installing Debian package prometheus"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
	      || echo "note: could not install 'prometheus'; the alert-rule tests will be skipped"; \
	  else \
	    echo "note: promtool not found (Debian package 'prometheus'); the alert-rule tests will be skipped"; \
	  fi; \
	fi

run: gen pg-check
	$(PY) -m cutylib.devstack

demo: gen
	$(PY) -m cutylib.demo

# The suite waits far more than it computes (service processes, PostgreSQL round trips, polls), so
# it runs on parallel workers (pytest-xdist), each with its own throwaway PostgreSQL, ports and
# folders (docs/testing.md). A test file goes to one worker whole (tests/conftest.py groups it) so
# its stack starts once, unless marked `spread`. A shared server (CUTY_TEST_DSN) holds one set of
# databases: there the suite runs serially.
TEST_WORKERS ?= $(if $(CUTY_TEST_DSN),0,4)
PYTEST := $(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup

test: gen pg-check promtool-check
	$(PYTEST) tests

test-unit: gen
	$(PYTEST) tests/unit

test-integration: gen pg-check
	$(PYTEST) tests/integration

test-e2e: gen pg-check
	$(PYTEST) tests/e2e

# Long soak / chaos variants (the short seeded versions run in `make test`).
soak: gen pg-check
	$(PY) -m pytest -q -m slow --timeout=3600 tests

bench: $(BENCHES)

# Explicit rules: make ignores pattern rules for .PHONY targets.
$(BENCHES): bench-%: gen pg-check
	$(PY) bench/$*.py

# The service image (deploy/k8s/Dockerfile), where a Docker engine runs.
IMAGE ?= cuty/checkout:dev
image:
	@command -v docker >/dev/null && docker info >/dev/null 2>&1 || { echo "error: no Docker engine answers; build the image where one runs (CI)"; exit 1; }
	docker build -f deploy/k8s/Dockerfile -t $(IMAGE) .

clean:
	rm -rf $(VENV) build
