# Two commands: `make run` starts everything; `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
LOCAL_STAMP := $(VENV)/.installed-local
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: run test test-fast check lint-js install model bench replay clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt -e .
	touch $(STAMP)

# The bundled model's server: llama.cpp's own server from the prebuilt xllamacpp wheel (no compiler).
$(LOCAL_STAMP): $(STAMP) requirements-local.txt
	$(BIN)/python -m pip install -r requirements-local.txt
	touch $(LOCAL_STAMP)

install: $(LOCAL_STAMP)

model: $(LOCAL_STAMP)
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

# Static checks of the Python code (pyproject.toml: [tool.ruff], [tool.mypy]): ruff's default rules, then mypy
# over the files [tool.mypy] names; both run, and the target fails when either finds anything.
check: $(DEV_STAMP)
	status=0; \
	$(BIN)/ruff check app workers scripts bench celery_app.py wsgi.py || status=1; \
	$(BIN)/mypy || status=1; \
	exit $$status

# The chat page's ES modules: eslint, TypeScript's checker over their JSDoc types (jsconfig.json), then their
# node unit tests (tests/js).
lint-js:
	npm ci --no-audit --no-fund
	npx eslint app/web/static/js
	npx tsc --noEmit -p jsconfig.json
	node --test tests/js/

bench: $(STAMP)
	$(BIN)/python bench/hot_path.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/ws_load.py

clean:
	rm -rf $(VENV) .pytest_cache test-output
