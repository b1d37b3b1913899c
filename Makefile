# The README's two commands: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROTOS := $(wildcard proto/execgate/v1/*.proto)

.PHONY: run test install proto lint typecheck bench clean

run: $(STAMP)
	$(BIN)/execgate serve --policy policies/default.yaml

test: $(STAMP)
	$(BIN)/python -m pytest

# Creates the venv and installs execgate (editable) with the test extras. Reinstalls
# when pyproject.toml, setup.py or a .proto changes, which regenerates execgate.v1.
$(STAMP): pyproject.toml setup.py $(PROTOS)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

proto: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -e .

lint: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	$(BIN)/ruff check executor client tests bench

typecheck: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	$(BIN)/mypy executor client

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py

clean:
	rm -rf $(VENV) gen build *.egg-info .pytest_cache
