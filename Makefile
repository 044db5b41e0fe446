# Replayable: `make demo` runs the pipeline on the bundled samples; `make test` checks it all.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STATE  := .local
DEVENV := PYTHONPATH=include $(PY) -m replayable.devenv --state $(STATE)
CONF   ?= {}
PYTEST_ARGS ?=

.PHONY: install run demo test lint bench airflow start stop status corpus clean

# The venv is rebuilt only when a requirements file changed since the last install.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements-dev.txt
	touch $@

install: $(VENV)/.installed

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

# --- chaos: production faults through a real Airflow (chaos/README.md, ADR 30-32) ---------
# Every scenario on 300 documents; results in chaos/results/latest.{json,md}.
.PHONY: chaos
chaos: install
	PYTHONPATH=include:tests $(PY) -m chaos
# --- end chaos -----------------------------------------------------------------------------
