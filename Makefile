# Carillon developer entry points. `make help` lists them.
# Everything runs inside .venv, created and kept in sync with pyproject.toml on demand.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
PYTEST_ARGS ?=
# Test processes (pytest-xdist): most tests wait on PostgreSQL or on a subprocess, so two
# overlap well on two cores; 0 runs the suite in this process, one test at a time.
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup
RUN_ARGS ?=
CHAOS_ARGS ?=
GAMEDAY_ARGS ?=
PROFILE_SCHEDULES ?= 200000
PROFILE_OUT ?= docs/img/bench-burst-flame.svg
REVS ?= HEAD~1 HEAD
ROUNDS ?= 3
LISTING_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help install test unit lint typecheck fmt run bench bench-layouts bench-peer bench-listing bench-profile bench-compare bench-node-path bench-instructions clean chromium console-screenshots chaos chaos-quick gameday sim-long

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-10s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# engine/__init__.py: it holds the version, which the installed metadata copies at install.
$(STAMP): pyproject.toml engine/__init__.py
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	@touch $(STAMP)

install: $(STAMP) ## Create .venv and install Carillon with its test and benchmark tools (idempotent)

test: $(STAMP) chromium lint typecheck ## Lint, type-check and run the whole test suite
	$(PYTEST) $(PYTEST_ARGS)

chromium: ## Install Debian's Chromium for the browser tests if missing and possible (never fails)
	@sh tests/console/ensure-chromium

console-screenshots: $(STAMP) chromium ## Retake docs/img/console-*.png from the demo dataset
	$(BIN)/python -m tests.console.screenshots docs/img

unit: $(STAMP) ## Run the test suite only (PYTEST_ARGS="-k ..." to filter; PYTEST_WORKERS=0: one process)
	$(PYTEST) $(PYTEST_ARGS)

lint: $(STAMP) ## ruff lint and format check
	$(BIN)/ruff check engine tests benchmarks simulations
	$(BIN)/ruff format --check engine tests benchmarks simulations

typecheck: $(STAMP) ## mypy --strict on engine/ and simulations/ (pyproject.toml [tool.mypy])
	$(BIN)/mypy

fmt: $(STAMP) ## Format and auto-fix lint findings
	$(BIN)/ruff format engine tests benchmarks simulations
	$(BIN)/ruff check --fix engine tests benchmarks simulations

run: $(STAMP) ## Migrate, mint an admin token, and start a node with its API and a demo schedule
	$(BIN)/carillon migrate
	@mkdir -p .carillon
	@test -f .carillon/admin-token || $(BIN)/carillon token create --admin --description "make run" --save .carillon/admin-token
	@echo "API on http://127.0.0.1:8080, console on http://127.0.0.1:8080/ui (admin token in .carillon/admin-token). In another shell:"
	@echo "  export CARILLON_TOKEN_FILE=.carillon/admin-token"
	@echo "  .venv/bin/carillon executions list --schedule demo-every-10s"
	$(BIN)/carillon run --demo --console-insecure-cookie true $(RUN_ARGS)

chaos: $(STAMP) ## Real-process chaos: 3 nodes, 2,000 schedules, 5 min of SIGKILL, SIGSTOP, a PostgreSQL restart
	$(BIN)/python -m simulations.chaos $(CHAOS_ARGS)

chaos-quick: $(STAMP) ## The ~80 s chaos run (part of make test)
	$(BIN)/python -m simulations.chaos --quick $(CHAOS_ARGS)

gameday: $(STAMP) ## Multi-region game day: forced failover + planned switch-over, ~9 min (GAMEDAY_ARGS=--quick)
	$(BIN)/python -m simulations.regions gameday $(GAMEDAY_ARGS)

sim-long: $(STAMP) ## Thousands of seeds of the deterministic simulator (docs/simulation.md)
	$(BIN)/python -m simulations sweep --seeds 1..5000

bench: $(STAMP) ## Run the benchmarks; rewrite docs/benchmarks.md, docs/img/bench-*.png, docs/bench-results/
	$(BIN)/python benchmarks/bench_cron.py
	$(BIN)/python benchmarks/bench_ledger.py
	$(BIN)/python benchmarks/bench_layouts.py
	$(BIN)/python benchmarks/bench_listing.py
	$(BIN)/python benchmarks/bench_scale.py
	$(BIN)/python benchmarks/bench_burst.py
	$(BIN)/python benchmarks/bench_failover.py
	$(BIN)/python benchmarks/bench_peer.py
	$(BIN)/python benchmarks/bench_webhooks.py
	$(BIN)/python benchmarks/bench_tracing.py
	$(BIN)/python benchmarks/bench_brokers.py

bench-layouts: $(STAMP) ## WAL and database CPU per execution under candidate ledger layouts
	$(BIN)/python benchmarks/bench_layouts.py

bench-peer: $(STAMP) ## The same burst on Carillon and on APScheduler 4 (its own .bench-peers/venv)
	$(BIN)/python benchmarks/bench_peer.py

bench-listing: $(STAMP) ## Execution listings on a 5M-execution ledger (LISTING_ARGS="--keep", "--reuse NAME")
	$(BIN)/python benchmarks/bench_listing.py $(LISTING_ARGS)

bench-profile: $(STAMP) ## py-spy flame graph of a one-node burst -> docs/img/bench-burst-flame.svg
	$(BIN)/py-spy record --nonblocking --format flamegraph --output $(PROFILE_OUT) -- \
		$(BIN)/python benchmarks/bench_burst.py --schedules $(PROFILE_SCHEDULES) --runs 1 \
		--workers 32 --rate 0 --nodes "" --no-ceiling --no-docs

bench-compare: $(STAMP) ## Revisions' bursts side by side, alternating (REVS="a b", . = working tree; ROUNDS=3)
	$(BIN)/python benchmarks/compare.py --rounds $(ROUNDS) $(REVS)

bench-node-path: $(STAMP) ## The node's own noop path (memory ledger) against REV, ABBA (REV=main; ROUNDS=3)
	$(BIN)/python benchmarks/bench_node_path.py --compare $(or $(REV),main) --runs $(ROUNDS)

bench-instructions: $(STAMP) ## Revisions' instructions per execution under valgrind (REVS="a b"; exact on a busy machine)
	$(BIN)/python benchmarks/compare.py --rounds 1 --instructions 3000,9000 $(REVS)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
