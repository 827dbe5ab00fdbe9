# icefloe developer commands. Everything installs what it needs into .venv on first use.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.icefloe-installed
# the compiled hot loops (icefloe/formats/_speedups.pyx, icefloe/otlp/_wire.pyx; without a C
# compiler icefloe runs the pure-Python path and says so)
SPEEDUPS := $(VENV)/.icefloe-speedups
PYTEST_ARGS ?=
# checkov (static checks of deploy/) lives in its own venv: its pins would downgrade
# boto3/botocore/packaging in .venv. tests/system/test_deploy.py runs it from there.
CHECKOV_VENV  := $(VENV)/tools/checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed
# DuckDB's own Iceberg extension (tests/pipeline/test_other_readers.py reads icefloe's tables
# with it) also lives apart: the extension wheels pin duckdb to their own version (1.5.5),
# which would downgrade the embedded query engine's duckdb in .venv.
DUCKDB_ICEBERG_VENV  := $(VENV)/tools/duckdb-iceberg
DUCKDB_ICEBERG_STAMP := $(DUCKDB_ICEBERG_VENV)/.installed
DUCKDB_ICEBERG_PINS  := duckdb==1.5.5 duckdb-extensions==1.5.5 duckdb-extension-iceberg==1.5.5 \
                        duckdb-extension-avro==1.5.5

.PHONY: up test test-slow lint bench chaos sim clean java venv iceberg-java

# every role and command ([all]) plus the test and build tools, at the versions the image
# installs (constraints.txt; scripts/constraints.py rewrites it after an upgrade)
$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[all,dev]'
	@touch $(STAMP)

# stamped only once built: without a compiler every make says so again (and builds them
# as soon as one is installed)
$(SPEEDUPS): $(STAMP) icefloe/formats/_speedups.pyx icefloe/otlp/_wire.pyx \
             $(wildcard icefloe/otlp/_wire_*.pxi) scripts/build_speedups.py
	$(BIN)/python scripts/build_speedups.py
	@if ls icefloe/formats/_speedups*.so icefloe/otlp/_wire*.so >/dev/null 2>&1; then \
		touch $(SPEEDUPS); fi

venv: $(STAMP) $(SPEEDUPS)

$(CHECKOV_STAMP):
	@test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(CHECKOV_VENV)/bin/python -m pip install --quiet 'checkov>=3.2,<4'
	@touch $(CHECKOV_STAMP)

$(DUCKDB_ICEBERG_STAMP): Makefile
	@test -x $(DUCKDB_ICEBERG_VENV)/bin/python || $(PYTHON) -m venv $(DUCKDB_ICEBERG_VENV)
	$(DUCKDB_ICEBERG_VENV)/bin/python -m pip install --quiet $(DUCKDB_ICEBERG_PINS)
	@touch $(DUCKDB_ICEBERG_STAMP)

# Java Iceberg's own reader for the slow suite (tests/java_iceberg_support.py): PySpark 3.5
# and the wheel that carries iceberg-spark-runtime-3.5_2.12-1.10.2.jar, in their own venv
# (the project's venv has PySpark 4).
ICEBERG_JAVA_VENV  := $(VENV)/tools/iceberg-java
ICEBERG_JAVA_STAMP := $(ICEBERG_JAVA_VENV)/.installed
ICEBERG_JAVA_PINS  := pyspark==3.5.7 snowpark-connect-deps-iceberg==1.0.3

$(ICEBERG_JAVA_STAMP): Makefile
	@test -x $(ICEBERG_JAVA_VENV)/bin/python || $(PYTHON) -m venv $(ICEBERG_JAVA_VENV)
	$(ICEBERG_JAVA_VENV)/bin/python -m pip install --quiet $(ICEBERG_JAVA_PINS)
	@touch $(ICEBERG_JAVA_STAMP)

iceberg-java: $(ICEBERG_JAVA_STAMP) java

# the OpenTelemetry JavaScript SDK and its OTLP exporters at the versions of
# tests/js/package-lock.json, which tests/otel_js_support.py runs with Node against a real
# ingestor (issue 41); reinstalled when the lock file changes. No install scripts run (the only
# one, protobufjs's, checks its CLI's version).
JS_DIR   := tests/js
JS_STAMP := $(JS_DIR)/node_modules/.icefloe-installed

$(JS_STAMP): $(JS_DIR)/package-lock.json $(JS_DIR)/package.json
	@command -v npm >/dev/null 2>&1 || { echo "make: npm is not on PATH: install Node.js 20 or later with npm (tests/js holds the OpenTelemetry JS exporters the OTLP tests run)" >&2; exit 1; }
	CI=true npm ci --prefix $(JS_DIR) --no-audit --no-fund --ignore-scripts --loglevel=error </dev/null
	@touch $(JS_STAMP)

java:
	@bash scripts/ensure-java.sh

## make up: run icefloe on the embedded default (local store + SQLite catalog in ./icefloe-data)
up: $(STAMP) $(SPEEDUPS) java
	$(BIN)/icefloe up

## make test: the fast suite (what CI runs); slow soak/chaos tests are marked `slow`
test: $(STAMP) $(SPEEDUPS) java $(CHECKOV_STAMP) $(DUCKDB_ICEBERG_STAMP) $(JS_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/mkdocs build --strict --quiet --site-dir build/site  # the docs site (mkdocs.yml): a broken link fails
	@COLUMNS=120 $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS); status=$$?; \
	  if [ $$status -eq 5 ]; then echo "make test: pytest collected no tests" >&2; exit 1; fi; \
	  exit $$status

# checkov too: the slow fresh-clone run of the deploy checks uses this tree's
test-slow: $(STAMP) $(SPEEDUPS) java $(CHECKOV_STAMP) $(DUCKDB_ICEBERG_STAMP) $(ICEBERG_JAVA_STAMP)
	$(BIN)/python -m pytest -m slow $(PYTEST_ARGS)

## make chaos DURATION=30m STORE=s3 SEED=7: a chaos run (kills, takeovers, store faults),
## then a proof that every acknowledged event landed exactly once; JSON in bench/results/
## (the harness is test tooling in testing/chaos/, run from this checkout; not in the wheel).
## A warm standby collector waits beside the active one, as in `icefloe up`;
## CHAOS_FLAGS=--no-standby: replacements boot Spark cold
DURATION ?= 5m
STORE    ?= local
SEED     ?= 1
CHAOS_FLAGS ?=
chaos: $(STAMP) $(SPEEDUPS) java
	$(BIN)/python -m testing.chaos --duration $(DURATION) --store $(STORE) --seed $(SEED) \
	  $(CHAOS_FLAGS) --json bench/results/chaos-$(STORE)-$(SEED).json

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# every benchmark once (QUICK=--quick by default; `make bench QUICK=` for the full runs), each
# writing bench/results/NAME.json, then the docs' figure tables regenerated from those files
QUICK ?= --quick
BENCHES := queue ingest collector mappings types evolve upsert models query conditions \
           security bulkhead scale typed kafka otlp replay dynamic_tables run_now \
           cold_start cluster_scale e2e compaction
bench: $(STAMP) $(SPEEDUPS) java
	@for b in $(BENCHES); do \
	  echo "== bench/$${b}_bench.py $(QUICK)"; \
	  $(BIN)/python bench/$${b}_bench.py $(QUICK) --json bench/results/$$b.json || exit 1; \
	done
	$(BIN)/python scripts/gen_docs.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache .hypothesis

## make sim SEED=N: replay one seed of the deterministic simulator (its whole story);
## make sim SEEDS=N: run seeds 1..N in parallel processes; JSON in bench/results/sim.json
SEEDS ?= 100
sim: $(STAMP) $(SPEEDUPS)
ifeq ($(origin SEED),command line)
	$(BIN)/python -m testing.sim --seed $(SEED)
else
	@mkdir -p bench/results
	$(BIN)/python -m testing.sim --seeds $(SEEDS) --json bench/results/sim.json
endif
