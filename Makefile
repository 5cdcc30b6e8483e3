# The targets are the documentation of how to work on jobrun.
# Every target bootstraps .venv from python3 when it is missing.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
GENERATED := jobrun/postgres/sqlc

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

.PHONY: venv
venv: $(STAMP) ## create .venv with jobrun (editable) and the dev tools

.PHONY: generate
generate: $(STAMP) ## regenerate jobrun/postgres/sqlc (db/query, db/migrations) and the sync store (*_async.py)
	rm -rf $(GENERATED)
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/sqlc generate
	$(PY) tools/check_sqlc_schema.py
	$(PY) tools/async_to_sync.py

.PHONY: check
check: $(STAMP) ## ruff, mypy strict, the import layers, the generated code is fresh, the docs site builds, sdist+wheel pass twine
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(PY) tools/check_generated.py
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet --site-dir site
	rm -rf dist
	$(PY) -m build --outdir dist .  # the wheel from the sdist: a file missing from it fails here
	$(VENV)/bin/twine check --strict dist/*

.PHONY: fmt
fmt: $(STAMP) ## format and auto-fix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: run
run: $(STAMP) ## the demo: 20,000 jobs on PostgreSQL (embedded unless DATABASE_URL is set)
	$(VENV)/bin/jobrun demo $(RUN_ARGS)

.PHONY: bench
bench: $(STAMP) ## the benchmark: figures as medians of 3 runs, in bench/results/
	$(PY) -m bench $(BENCH_ARGS)

# The peers of bench-peers live in a virtualenv of their own, never in jobrun's.
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed

$(PEERS_STAMP): bench/peers/requirements.txt
	@test -x $(PEERS_VENV)/bin/python || $(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install --quiet -r bench/peers/requirements.txt
	@touch $(PEERS_STAMP)

.PHONY: bench-peers
bench-peers: $(STAMP) $(PEERS_STAMP) ## jobrun side by side with PgQueuer and procrastinate (+ raw limits), in bench/results/
	$(PY) -m bench.peers --peers-python $(PEERS_VENV)/bin/python $(PEERS_ARGS)

# Two pytest-xdist workers, each with a PostgreSQL of its own, a test file
# at a time (a file's module-scoped fixtures are set up once): much of the
# suite waits on timers and subprocesses, so two halves overlap well even on
# two cores. PYTEST_WORKERS=0 runs in one process (a debugger, a bisection).
PYTEST_WORKERS ?= 2

.PHONY: test
test: $(STAMP) ## the whole test suite against a real PostgreSQL it starts itself
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

.PHONY: test-faults
test-faults: $(STAMP) ## the fault-injection suite (real processes, kills, proxy, restarts)
	$(PY) -m pytest tests/faults $(PYTEST_ARGS)

.PHONY: test-plan-large
test-plan-large: $(STAMP) ## the claim's plan with 1,000,000 blocked (waiting) jobs beside the runnable ones
	JOBRUN_PLAN_WAITING=$${JOBRUN_PLAN_WAITING:-1000000} \
		$(PY) -m pytest tests/bench/test_claim_plan.py -s -k waiting $(PYTEST_ARGS)

.PHONY: test-pgbouncer
test-pgbouncer: $(STAMP) ## jobrun through a real PgBouncer (in make test too); the 10,000-job oracle for 2 minutes
	JOBRUN_PGBOUNCER_ORACLE_JOBS=10000 JOBRUN_PGBOUNCER_ORACLE_SECONDS=120 \
		$(PY) -m pytest tests/pgbouncer $(PYTEST_ARGS)

.PHONY: test-scale
test-scale: $(STAMP) ## worker hosts (network namespaces) added against one PostgreSQL, direct and via PgBouncer; figures in bench/results/
	JOBRUN_SCALE_JOBS=$${JOBRUN_SCALE_JOBS:-30000} \
		JOBRUN_SCALE_OUT=$${JOBRUN_SCALE_OUT:-bench/results/scale-$$(date -u +%Y%m%dT%H%M%SZ).json} \
		$(PY) -m pytest tests/scale -s $(PYTEST_ARGS)

.PHONY: clean
clean: ## remove the virtualenvs and caches
	rm -rf $(VENV) $(PEERS_VENV) .pytest_cache .mypy_cache .ruff_cache dist build site
