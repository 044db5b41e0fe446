# Replayable: `make demo` runs the pipeline on the bundled samples; `make test` checks it all.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STATE  := .local
DEVENV := PYTHONPATH=include $(PY) -m replayable.devenv --state $(STATE)
CONF   ?= {}
PYTEST_ARGS ?=

.PHONY: install run demo test lint bench airflow start stop status corpus clean lock lock-check \
        cluster cluster-run cluster-stop redis

# --- Locked dependencies (tools/lock.py; ADR 0020) -----------------------------------
# The venv installs exactly requirements-dev.lock: every package pinned with its hashes,
# nothing resolved here (--no-deps; the lock is complete and `pip check` confirms it). It is
# re-synced only when a lock changed since the last install. To add a package: put it,
# pinned, in requirements.txt (runtime, goes into the image) or requirements-dev.txt (tools
# and tests), run `make lock`, then `make install`, and commit the inputs and both locks.
$(VENV)/.installed: requirements.lock requirements-dev.lock
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements-dev.lock
	$(PY) -m pip check
	touch $@

install: $(VENV)/.installed

# Regenerate both locks from requirements*.txt against Airflow's constraints (UPGRADE=1:
# newest allowed versions; otherwise the current pins are kept where they still fit).
lock: install
	$(PY) tools/lock.py lock $(if $(UPGRADE),--upgrade)

# pip freeze of the venv must equal the dev lock, package for package.
lock-check: install
	$(PY) tools/lock.py check --python $(PY)
# --- end of locked dependencies ---------------------------------------------------------

start: install
	@$(DEVENV) start

stop:
	@test ! -x $(PY) || $(DEVENV) stop

status: install
	@$(DEVENV) status

# One run of document_pipeline with CONF, e.g. make run CONF='{"source": "/data/pdfs"}'.
# Services it had to start are stopped afterwards, however the run ends.
run: install
	@$(DEVENV) run --conf '$(CONF)'

demo: install
	@$(MAKE) --no-print-directory run CONF='{"batch_size": 8}'

test: install
	$(PY) -m pytest $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPYPATH=include $(VENV)/bin/mypy

bench: install
	PYTHONPATH=include $(PY) bench/run.py

# Airflow's UI and scheduler on http://127.0.0.1:8080 against the embedded Postgres.
airflow: install
	@$(DEVENV) airflow

corpus: install
	$(PY) tests/corpus.py --out data/samples

clean: stop
	rm -rf $(STATE)

# --- Local Celery cluster (ADR 0021) --------------------------------------------------
# Redis (Debian's redis-server, installed when missing), an API server, a scheduler, a DAG
# processor, a triggerer and two Celery workers, each in its own process group on 127.0.0.1,
# on the embedded Postgres and the local model server, with airflow.env: the settings
# docker-compose.yaml runs. It keeps running until `make cluster-stop` (or `make stop`).
# `make cluster-run` runs document_pipeline over DOCS generated PDFs and says which worker
# ran what.
DOCS ?= 200

redis:
	@tools/install-redis.sh

# The cluster test (tests/e2e/test_cluster.py) in `make test` needs Redis too.
test: redis

cluster: install redis
	@$(DEVENV) cluster

cluster-run: install
	@$(PY) tests/corpus.py --out $(STATE)/corpus --n $(DOCS)
	@$(DEVENV) cluster-run --conf '{"source": "$(abspath $(STATE))/corpus", "batch_size": 25}'

cluster-stop:
	@test ! -x $(PY) || $(DEVENV) cluster-stop
# --- end of local Celery cluster ------------------------------------------------------
