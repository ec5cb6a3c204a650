# Two commands: `make run` starts everything; `make test` runs the whole suite.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test install bench clean

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest

run: $(STAMP)
	$(BIN)/python scripts/dev.py

bench: $(STAMP)
	$(BIN)/python bench/hot_path.py
	$(BIN)/python bench/compaction.py
	$(BIN)/python bench/ws_load.py

clean:
	rm -rf $(VENV) .pytest_cache test-output
