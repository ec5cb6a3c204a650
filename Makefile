# Two commands: `make run` starts everything; `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
BENCH_STAMP := $(VENV)/.installed-bench

.PHONY: run test test-fast check lint-js install model bench replay clean

# The runtime (requirements.txt) and the app (-e .); the local stack that `make run` and the tests start
# (requirements-local.txt: honcho, the embedded store, the bundled model's server from the prebuilt xllamacpp
# wheel, no compiler); the tests' own requirements; and the support package the tests and benchmarks share
# (support/: the fake model server and helpers).  tests/, bench/ and scripts/ run from this folder.
$(STAMP): requirements.txt requirements-local.txt requirements-test.txt pyproject.toml support/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt -r requirements-local.txt -r requirements-test.txt \
		-e . -e ./support
	touch $(STAMP)

$(BENCH_STAMP): $(STAMP) requirements-bench.txt
	$(BIN)/python -m pip install -r requirements-bench.txt
	touch $(BENCH_STAMP)

install: $(STAMP)

model: $(STAMP)
	$(BIN)/python scripts/local_model.py fetch

run: model
	$(BIN)/python scripts/dev.py || test $$? -eq 130  # Ctrl+C is the normal way to stop

test: model
	$(BIN)/python -m pytest

# The fast lane: no browser, no whole-process or bundled-model tests (tests/fixtures/lanes.py), one
# pytest-xdist worker per core, each with its own embedded store (tests/fixtures/redis_server.py).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not browser" -n auto

# The static checkers (requirements-dev.txt), beside the runtime's venv.
$(DEV_STAMP): $(STAMP) requirements-dev.txt
	$(BIN)/python -m pip install -r requirements-dev.txt
	touch $(DEV_STAMP)

# Static checks of the Python code (pyproject.toml: [tool.ruff], [tool.mypy]): ruff (its default rules, import order,
# bugbear), then mypy
# over the files [tool.mypy] names; both run, and the target fails when either finds anything.
check: $(DEV_STAMP)
	status=0; \
	$(BIN)/ruff check app workers scripts bench support tests celery_app.py wsgi.py || status=1; \
	$(BIN)/mypy || status=1; \
	exit $$status

# The chat page's ES modules: eslint, TypeScript's checker over their JSDoc types (jsconfig.json), then their
# node unit tests (tests/js).
lint-js:
	npm ci --no-audit --no-fund
	npx eslint app/web/static/js
	npx tsc --noEmit -p jsconfig.json
	node --test tests/js/

# Benchmarks run as modules from this folder (bench/ is not installed): `python -m bench.<name>`.
bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.hot_path
	$(BIN)/python -m bench.compaction
	$(BIN)/python -m bench.ws_load

clean:
	rm -rf $(VENV) .pytest_cache test-output
