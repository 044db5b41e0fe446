# Replayable: `make demo` runs the pipeline on the bundled samples; `make test` checks it all.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STATE  := .local
DEVENV := PYTHONPATH=include:. $(PY) -m devtools.devenv --state $(STATE)
CONF   ?= {}
DAG    ?= document_pipeline
PYTEST_ARGS ?=
# Compiled modules are cached (in __pycache__, ignored by git) even where the environment
# turns that off: otherwise each of the test workers compiles the package and rewrites every
# test module's asserts again, a quarter of `make test-fast`. Python reads an empty value
# as unset.
export PYTHONDONTWRITEBYTECODE :=

.PHONY: install run demo test test-fast simulate lint bench bench-smoke chaos airflow start stop status env corpus \
        clean lock lock-check cluster cluster-run cluster-stop redis

# --- Locked dependencies (tools/lock.py; ADR 0020) -----------------------------------
# The venv installs exactly requirements-dev.lock: every package pinned with its hashes,
# nothing resolved here (--no-deps; the lock is complete and `pip check` confirms it). It is
# re-synced only when a lock changed since the last install. To add a package: put it,
# pinned, in requirements.txt (runtime, goes into the image) or requirements-dev.txt (tools
# and tests), run `make lock`, then `make install`, and commit the inputs and both locks.
# Then the project itself is installed editable (ADR 0063), which puts `replayable` on the
# venv's PATH and registers its Airflow provider: no dependencies (the lock has them), no
# build isolation (the locked setuptools builds it; nothing is fetched); include/ stays the
# code that runs.
$(VENV)/.installed: requirements.lock requirements-dev.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes --no-deps -r requirements-dev.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation --editable .
	$(PY) -m pip check
	touch $@

install: $(VENV)/.installed

# Regenerate both locks from requirements*.txt against Airflow's constraints (UPGRADE=1:
# newest allowed versions; otherwise the current pins are kept where they still fit).
lock: install
	$(PY) tools/lock.py lock $(if $(UPGRADE),--upgrade)

# pip freeze of the venv must equal the dev lock, package for package (the project's own
# editable install aside).
lock-check: install
	$(PY) tools/lock.py check --python $(PY)
# --- end of locked dependencies ---------------------------------------------------------

start: install
	@$(DEVENV) start

stop:
	@test ! -x $(PY) || $(DEVENV) stop

status: install
	@$(DEVENV) status

# Shell exports that point Airflow and the `replayable` command at the local services:
# eval "$$(make -s env)".
env: install
	@$(DEVENV) env

# One run of the pipeline DAG (document_pipeline unless DAG names another of dags/) with
# CONF, e.g. make run CONF='{"source": "/data/pdfs"}' or make run DAG=keyword_pipeline; it
# prints the run's report. Services it had to start are stopped afterwards, however it ends.
run: install
	@$(DEVENV) run --dag '$(DAG)' --conf '$(CONF)'

demo: install
	@$(MAKE) --no-print-directory run DAG=document_pipeline CONF='{"batch_size": 8, "model": "local-wordllama-256", "stages": ["extract", "chunk", "embed", "summarize"]}'

# Every tier, in two sessions: the unit, database and harness tiers on four pytest-xdist
# workers, then the tiers that boot Airflow, a cluster, a clean venv or the benchmarks, one
# at a time (they share one Airflow, and two of them would starve each other on two cores;
# the bench smoke is CPU-bound). Each session lists its 25 slowest tests, so that CI's log
# shows where the time goes; either one finding no test fails (pytest's exit code 5).
# PYTEST_ARGS go to both.
SLOW_TIERS := e2e or realworld or chaos or cluster or bench or packaging or simulation
test: install
	$(PY) -m pytest $(XDIST) -m "not ($(SLOW_TIERS))" --durations=25 $(PYTEST_ARGS)
	$(PY) -m pytest -m "$(SLOW_TIERS)" --durations=25 $(PYTEST_ARGS)

# The simulation (ADR 0136) walks one seed further than make test does: a failure prints the
# seed and its steps, and the same SEED and STEPS walk them again.
STEPS ?= 200
SEED ?= 1
simulate: install
	REPLAYABLE_SIM_STEPS=$(STEPS) REPLAYABLE_SIM_SEED=$(SEED) \
	  $(PY) -m pytest -m simulation tests/simulation --durations=5 $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	MYPYPATH=include $(VENV)/bin/mypy
	PYTHONPATH=include:. $(VENV)/bin/lint-imports --no-cache

# Every figure at full size, each benchmark in 3 separate runs (bench/run.py --repeat; about
# 45 minutes a run on 2 cores); medians and ranges in bench/results/.
bench: install
	PYTHONPATH=include:. $(PY) bench/run.py

# Every benchmark at a reduced size, checking counts, never times (make test runs it too).
bench-smoke: install
	PYTHONPATH=include:. $(PY) bench/run.py --smoke

# Airflow's UI and scheduler on http://127.0.0.1:8080 against the embedded Postgres.
airflow: install
	@$(DEVENV) airflow

corpus: install
	$(PY) tests/corpus.py --out data/samples

clean: stop
	rm -rf $(STATE)

# ---- monitoring: Prometheus alert rules in monitoring/ --------------------------------------
# promtool (from Debian's prometheus package) is installed into .local/tools when missing, so
# that `make test` can run `promtool test rules`; exit status 2 means apt is unavailable, and
# the tests then skip saying so.
.PHONY: promtool alerts-test

promtool:
	@monitoring/install-promtool.sh >/dev/null || [ $$? -eq 2 ]

test: promtool

alerts-test: promtool
	cd monitoring && "$$(./install-promtool.sh)" check rules alerts.yml
	cd monitoring && "$$(./install-promtool.sh)" test rules alerts.test.yml

# ---- security (issue 9) -----------------------------------------------------------------
# `make secrets` writes .env for docker-compose.yaml with fresh random secrets. An existing
# .env is kept (at a terminal you are asked); `make secrets FORCE=1` replaces its secrets.
# `make test` first installs Debian's Chromium for the browser test (idempotent and quiet;
# if it cannot, that test skips and says why). The Python packages come with `install`.
.PHONY: secrets browser
secrets:
	@$(PYTHON) docker/make_secrets.py --env .env $(if $(FORCE),--force)

browser:
	@tests/install-browser.sh || echo "make browser: Chromium is not installed; the browser test will skip"

test: browser

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

# --- chaos: production faults through a real Airflow (chaos/README.md, ADR 30-32, 81) -----
# Every scenario, (a)-(l), at full size; results in chaos/results/latest.{json,md}; exits 1
# when a scenario fails. CHAOS_ARGS='--only h,i --documents 60' runs a subset, smaller.
.PHONY: chaos
chaos: install
	PYTHONPATH=include:tests:. $(PY) -m chaos $(CHAOS_ARGS)
# --- end chaos -----------------------------------------------------------------------------

# --- real-world PDFs: the producers tests/realworld.py drives (LibreOffice, Ghostscript, groff,
# LaTeX), installed from Debian's packages when missing; without them those tests skip, saying
# so. ------------------------------------------------------------------------------------------
.PHONY: realworld-tools test-fast
realworld-tools:
	@tests/install-realworld-tools.sh >/dev/null || echo "make realworld-tools: the PDF producers could not be installed; the real-world tests will skip"

test: realworld-tools

# The inner loop: the unit and database tiers (a real Postgres, started once), without
# Airflow, the PDF producers or a clean venv. Tiers, by marker: db (a real Postgres), e2e
# (DAGs through Airflow), realworld, chaos, cluster, bench, packaging, harness (pytest checking
# its own harness); `make test` runs them all.
# Four pytest-xdist workers (each its own Postgres and model server): most of these tests wait
# on a database, a socket or a child process rather than the CPU. The fuzz tests draw fewer
# examples here than in `make test`; tests/e2e (all of it e2e) is not even imported.
# Work stealing: the tests run from milliseconds to ten seconds, so a worker that runs out
# takes half of a busy worker's queue instead of waiting at the end behind one long test.
XDIST := -n 4 --dist worksteal
# The containment tier (guards and poison documents burning CPU and memory on purpose, about a
# sixth of these tiers' CPU) is left out too: make test runs it in its first session. So is the
# simulation (a seeded walk of a minute or two), which make test runs in its second.
FAST_TIERS := not e2e and not realworld and not chaos and not cluster and not bench and not packaging and not harness and not containment and not simulation
test-fast: install
	REPLAYABLE_FUZZ_EXAMPLES=100 REPLAYABLE_FUZZ_PER_OPERATION=4 \
	  $(PY) -m pytest $(XDIST) -m "$(FAST_TIERS)" --ignore=tests/e2e $(PYTEST_ARGS)
