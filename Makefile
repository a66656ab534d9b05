# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Every version `make test` installs is pinned in DEV_LOCK; GATEWAY_LOCK is the gateway with its
# drivers (`pip install mqgate[redis,postgres]`) at the same versions: every documented command
# works after `make run`, which does not fetch Spark.
DEV_LOCK := requirements/dev.lock
GATEWAY_LOCK := requirements/gateway.lock
INSTALLED := $(shell cat pyproject.toml $(DEV_LOCK) $(GATEWAY_LOCK) | sha1sum | cut -c1-12)
DEV_STAMP := $(VENV)/.installed-dev-$(INSTALLED)
GATEWAY_STAMP := $(VENV)/.installed-gateway-$(INSTALLED)
# `make lock` runs uv from a venv of its own, at this version.
UV_VERSION ?= 0.13.9
UV := $(VENV)-uv/bin/uv
LOCK_FLAGS := --universal --python-version 3.11 --generate-hashes --quiet --custom-compile-command "make lock"
# `make run HOST=… PORT=… DATA_DIR=…`: only the variables given on make's command line become
# flags of `mqgate serve`, so otherwise the settings' own order holds (defaults 127.0.0.1, 8080,
# ./data; then the --config file, then MQGATE_HOST, MQGATE_PORT, MQGATE_DATA_DIR).
flag = $(if $(and $(filter command line,$(origin $(1))),$($(1))),$(2) $($(1)))
SERVE_FLAGS = $(call flag,HOST,--host) $(call flag,PORT,--port) $(call flag,DATA_DIR,--data-dir)
# Extra pytest arguments for `make test` and `make test-fast`: `make test PYTEST_ARGS="-k produce -x"`.
PYTEST_ARGS ?=
# Both run the suite in TEST_WORKERS processes (pytest-xdist; 0: in this one). tests/conftest.py
# keeps a module's tests in one process and the Spark suites in one. Four on this 2-core machine:
# most tests wait on the gateways, servers and browsers they start, so two per core overlap those
# waits (quiet machine, 2026-11-28: 13 min 20 s with four, 20 min 29 s with two, 36-38 in one).
TEST_WORKERS ?= 4
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)
# `make test` (and CI) runs everything and reports the coverage of the test process (pyproject's
# [tool.coverage.run]); `make test-fast` leaves coverage out. Run whole, `make test` fails under
# COVERAGE_FLOOR: a whole run's total (test process only; 75.07 % on a clean clone at b640894,
# 2026-11-29, from 77.77 % at c99dd7c: the Aliyun and half-message edges, WebSocket streams and
# the console's new pages run in the gateway processes the tests start, which this measure
# leaves out, as it does the console's pages, the SQS edge and message-level consumption)
# rounded down, minus one. With PYTEST_ARGS: coverage, no floor.
COVERAGE_FLOOR := 74
COVERAGE_ARGS = --cov --cov-report=term:skip-covered $(if $(PYTEST_ARGS),,--cov-fail-under=$(COVERAGE_FLOOR))

.PHONY: install install-gateway bytecode run test test-fast lint bench lock vendor clean browser screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Both stamps change with pyproject.toml or either lock; the project itself installs without its
# dependencies (the lock has them) and without build isolation (the lock has setuptools).
$(DEV_STAMP): pyproject.toml $(DEV_LOCK) | $(BIN)/python
	$(BIN)/python -m pip install -q -r $(DEV_LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-* && touch $(DEV_STAMP) $(GATEWAY_STAMP)

$(GATEWAY_STAMP): pyproject.toml $(GATEWAY_LOCK) | $(BIN)/python
	$(BIN)/python -m pip install -q -r $(GATEWAY_LOCK)
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	rm -f $(VENV)/.installed-gateway-* && touch $(GATEWAY_STAMP)

install: $(DEV_STAMP) bytecode

# The editable install runs the sources; where PYTHONDONTWRITEBYTECODE is set (this machine's
# environment) nothing caches their bytecode, and every gateway process (`make run`, each one
# the tests start) compiled all of them again: 0.2-0.4 s of its start. Only changed files are
# compiled again; Python still reads the cache when it may not write one.
bytecode: | $(BIN)/python
	$(BIN)/python -m compileall -q src/mqgate > /dev/null

install-gateway: $(GATEWAY_STAMP) bytecode

run: install-gateway
	$(BIN)/mqgate $(strip serve $(SERVE_FLAGS))

test: install browser js-deps
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/pytest $(XDIST) $(COVERAGE_ARGS) $(PYTEST_ARGS)

# The console's browser tests drive Debian's Chromium (Playwright's own browser download cannot
# work here). Installed when missing and we may (root with apt-get); otherwise those tests say
# so: they fail in CI and skip loudly elsewhere.
CHROMIUM ?= /usr/bin/chromium
browser:
	@test -x $(CHROMIUM) || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
		&& DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
		|| echo "WARNING: $(CHROMIUM) is missing and could not be installed (apt-get install chromium)"; }

# The JavaScript SDK the SQS tests drive (tests/sqs/test_sqs_js.py), from the npm registry at the
# versions of its package-lock.json; again only when the lock is newer than the last install.
# Without npm, a warning: that test then fails in CI and skips loudly elsewhere.
# The JS SDKs the suite drives unchanged: SQS's (tests/sqs/js) and Alibaba Cloud MQ's (tests/aliyun/js).
JS_DIR := tests/sqs/js
ALIYUN_JS_DIR := tests/aliyun/js
JS_STAMP := $(JS_DIR)/node_modules/.installed
ALIYUN_JS_STAMP := $(ALIYUN_JS_DIR)/node_modules/.installed
js-deps: $(JS_STAMP) $(ALIYUN_JS_STAMP)
%/node_modules/.installed: %/package-lock.json %/package.json
	@if command -v npm >/dev/null; then cd $* && npm ci --no-audit --no-fund && touch node_modules/.installed; \
	else echo "WARNING: npm is missing: $*/node_modules not installed (apt-get install nodejs npm)"; fi

# Everything but the tests marked slow (`pytest.mark.slow`, declared in pyproject.toml): crash and
# restart cycles, load, Spark, the pipeline on Spark, schemathesis over the whole API, trace
# analytics on Spark, Redis Cluster failover and Sentinel, the browser.
test-fast: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/mypy
	$(BIN)/pytest $(XDIST) -m "not slow" $(PYTEST_ARGS)

# The console's screenshots in docs/images (docs/CONSOLE.md shows them), taken afresh by the browser
# tests that make them; a plain test run keeps them in tests/console/artifacts only.
screenshots: install browser
	MQGATE_DOCS_SCREENSHOTS=1 $(BIN)/pytest -q -p no:randomly tests/console/test_browser_topic.py \
		tests/console/test_browser_clusters.py tests/console/test_browser_actions.py \
		tests/console/test_browser_polish.py

lint: install
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

bench: install
	command -v wrk >/dev/null || (apt-get update -qq && apt-get install -y -qq wrk)
	$(BIN)/python benchmarks/run.py $(BENCH_ARGS)

# The console's chart library, from the npm registry into the package (checked against a pinned
# sha512); its files are committed, so neither `make run` nor `make test` needs npm or a network.
vendor:
	scripts/vendor_uplot.sh

$(UV):
	$(PYTHON) -m venv $(VENV)-uv
	$(VENV)-uv/bin/python -m pip install -q uv==$(UV_VERSION)

# Re-resolve from PyPI after a change to the dependencies in pyproject.toml (or to take newer
# releases): the plain lock is constrained to the dev lock, so both install the same versions.
lock: $(UV)
	$(UV) pip compile pyproject.toml requirements/build.in --extra dev $(LOCK_FLAGS) -o $(DEV_LOCK)
	$(UV) pip compile pyproject.toml requirements/build.in --extra redis --extra postgres -c $(DEV_LOCK) $(LOCK_FLAGS) -o $(GATEWAY_LOCK)

clean:
	rm -rf $(VENV) $(VENV)-uv build *.egg-info src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
