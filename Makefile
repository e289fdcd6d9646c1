# evq — every target creates .venv when it is missing and installs the project into it,
# with the extras it needs: `serve` the server's (Ray, the log's stores), the others `dev`
# (everything the tests, linters and load tests use; pyproject.toml lists the extras).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev
SERVER := $(VENV)/.installed-server
# The SQS query protocol as older SDKs speak it (see the rule for $(LEGACY) below).
LEGACY_VENV := .venv-sqs-legacy
LEGACY      := $(LEGACY_VENV)/.installed

.PHONY: setup serve test test-all check lint typecheck fmt bench clean

# pytest-xdist workers for `test` and `check`: a module's tests on one worker, the Spark
# modules and the overload and chaos campaigns all on one (tests/conftest.py). Three on our
# two cores: with two, the CPU idled ~10 % of the run while tests waited for servers and
# timers (16 min 6 s of tests against 14 min 40 s with three, 2026-11-28).
WORKERS ?= 3
XDIST   := -n $(WORKERS) --dist loadfile

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel

# Reinstall only when the project's metadata changed (editable install: code changes need
# nothing). One stamp per extra: .installed-dev, .installed-server.
$(VENV)/.installed-%: pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[$*]'
	touch $@

setup: $(STAMP)

serve: $(SERVER)
	$(VENV)/bin/evq serve $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# mypy with pyproject.toml's [tool.mypy] (strict for actors/core, actors/log, actors/status, watch/, the
# watch transports' hub and codec, and evq/__init__.py).
typecheck: $(STAMP)
	$(VENV)/bin/mypy actors gateway watch pipeline evq

fmt: $(STAMP)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

test: $(STAMP) lint typecheck chromium java fuse $(LEGACY)
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# The inner loop while working (about 2-3 minutes): lint, types, and the unit tests (pure
# engine, codecs, the gateway in-process, the manifests): no Ray, no server processes, no
# Spark. CI runs `make test`.
check: $(STAMP) lint typecheck
	$(PY) -m pytest $(XDIST) tests/unit tests/k8s $(PYTEST_ARGS)

test-all: $(STAMP) chromium java fuse $(LEGACY)
	$(PY) -m pytest -m '' $(XDIST) $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) loadtest/bench_engine.py

clean:
	rm -rf $(VENV) $(LEGACY_VENV) .pytest_cache .ruff_cache .mypy_cache build *.egg-info

# The SQS query protocol as older SDKs speak it: boto3/botocore 1.34.50 and the AWS CLI of
# that era (awscli 1.32.50) in a virtualenv of their own, for
# tests/integration/test_sqs_clients.py (pins in tests/sqs_legacy/).
$(LEGACY): tests/sqs_legacy/requirements.txt
	$(PYTHON) -m venv $(LEGACY_VENV)
	$(LEGACY_VENV)/bin/pip install -q -r tests/sqs_legacy/requirements.txt
	touch $(LEGACY)

# A short headless Locust run of the mixed fleet (1000 producers + 1000 consumers, 60 s)
# against a fresh evq serve on 127.0.0.1; CSV and HTML reports in loadtest/reports/.
# Options of loadtest/smoke.py go in LOADTEST_ARGS (e.g. LOADTEST_ARGS="--time 30s").
.PHONY: loadtest
loadtest: $(STAMP)
	$(PY) loadtest/smoke.py $(LOADTEST_ARGS)

# Headless Chromium (Debian's package) for the browser tests (the dashboard, the pipeline's
# report); installed only when missing.
.PHONY: chromium
chromium:
	@command -v chromium >/dev/null 2>&1 || (apt-get update && apt-get install -y chromium)

# Java 17 for PySpark (the pipeline's tests): Debian's headless JRE, installed only when
# there is no java at all.
.PHONY: java
java:
	@command -v java >/dev/null 2>&1 || (apt-get update && apt-get install -y openjdk-17-jre-headless)

# libfuse 3 and fusermount3 (Debian's fuse3) for the real disk-fault tests: loadtest/faultfs.py
# is a FUSE file system that fails fsyncs or slows writes on command. Installed only when
# missing.
.PHONY: fuse
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || (apt-get update && apt-get install -y fuse3)
