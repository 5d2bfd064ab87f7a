# mado: the README's two commands are `make demo` and `make test`; both start with `make install`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PIP := $(VENV)/bin/pip
PY := $(VENV)/bin/python
# pip prints a warning per package for the machine's unused local index folders; hide only those.
QUIET_PIP := 2>&1 | grep -v "is ignored: it is neither a file nor a directory" || true

.PHONY: install install-dev mlflow-server demo test test-integration test-container image lint benchmark clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml sdk/pyproject.toml package.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip $(QUIET_PIP)
	$(PIP) install --quiet -e . -e ./sdk $(QUIET_PIP)
	$(PY) -c "import django, torch, mado_tracking"
	@if command -v npm >/dev/null; then npm ci --no-audit --no-fund --silent; \
	else echo "npm not found: pages work without live refresh (htmx)"; fi
	touch $@

install-dev: $(VENV)/.installed-dev

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install --quiet -e '.[dev]' -e './sdk[integrations]' $(QUIET_PIP)
	$(PY) -c "import pytest_django, pytest_timeout, playwright, moto, transformers, lightning, accelerate, torch; \
		assert torch.__version__.startswith('2.13.0'), torch.__version__"
	$(VENV)/bin/ruff --version
	touch $@

# A real MLflow server for the registry's parity test (tests/mlflow_client/test_mlflow_registry_parity.py): the full
# `mlflow` of the very version pyproject.toml pins mlflow-skinny to, in its own environment, since it brings what nothing else
# needs (scikit-learn, scipy, pyarrow, matplotlib, alembic, …) and would slow every install. .ci/run builds it
# in the background of the install and lint steps; without it that one test skips (fails under CI).
MLFLOW_SERVER_VENV := .venv-mlflow-server
MLFLOW_VERSION = $(shell $(PYTHON) -c "import re, tomllib; dev = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']; print(next(re.split('==', r)[1].strip() for r in dev if r.startswith('mlflow-skinny==')))")
mlflow-server: $(MLFLOW_SERVER_VENV)/.installed

$(MLFLOW_SERVER_VENV)/.installed: pyproject.toml
	test -x $(MLFLOW_SERVER_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_SERVER_VENV)
	$(MLFLOW_SERVER_VENV)/bin/pip install --quiet "mlflow==$(MLFLOW_VERSION)" $(QUIET_PIP)
	test "$$($(MLFLOW_SERVER_VENV)/bin/mlflow --version)" = "mlflow, version $(MLFLOW_VERSION)"
	touch $@

# `make demo PORT=8001` serves on another port (default 8000).
PORT ?= 8000
demo: install
	$(PY) manage.py demo --port $(PORT)

# Both suites run on every core with pytest-xdist (docs/design/house.md#tests): `make test TEST_WORKERS=0` runs
# in this process alone; PYTEST_ARGS adds pytest options (e.g. `-k name`, a report file).
TEST_WORKERS ?= auto
PYTEST_ARGS ?=
PYTEST := $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup

test: install-dev
	$(PYTEST) $(PYTEST_ARGS)

# The same flows against PostgreSQL, Redis and an S3-compatible server (moto); .ci/run starts the services.
# Outside tests/integration only the tests that touch the database run again (tests/conftest.py).
test-integration: install-dev
	MADO_TEST_DATABASE_ONLY=1 MADO_DATABASE_URL=$${MADO_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres} \
	MADO_TEST_REDIS_URL=$${MADO_TEST_REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(PYTEST) -o addopts="-ra" $(PYTEST_ARGS) tests/integration tests/runs tests/sweeps tests/checkpoints tests/parity tests/mlflow_api tests/sdk \
		tests/mlflow_client/test_mlflow_stock_integrations.py

# mado's images (docs/deploy.md#images): a local Debian base, a wheelhouse of what this host resolved, podman build.
image: install
	PIP=$(PIP) deploy/build-image.sh

# The images run as an operator runs them (web, workers, beat; `podman kube play` of the manifests) against
# PostgreSQL, Redis and moto's S3: a few minutes, so not part of `make test`; .ci/run runs it.
test-container: install-dev image
	MADO_DATABASE_URL=$${MADO_TEST_DATABASE_URL:-postgresql://postgres@127.0.0.1:5432/postgres} \
	MADO_TEST_REDIS_URL=$${MADO_TEST_REDIS_URL:-redis://127.0.0.1:6379/15} \
	$(VENV)/bin/pytest -o addopts="-ra" -m container tests/container

# The house style held by a tool (docs/design/house.md#comments): lint with import order, then the formatter's check.
lint: install-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

benchmark: install-dev
	$(PY) benchmarks/metrics_ingest.py

clean:
	rm -rf $(VENV) $(MLFLOW_SERVER_VENV) var node_modules
