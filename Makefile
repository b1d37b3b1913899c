# The README's two commands: `make run` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PROTOS := $(wildcard proto/execgate/v1/*.proto)
# The run-state machine's data: both clients' tables and the daemon's are generated from it.
RUNSTATES := proto/execgate/v1/runstates.json

.PHONY: run test test-ts test-image test-deps install proto lint typecheck bench bench-tools fuzz clean

# `make run`'s daemon: the shipped policy, and an `agent` and an `operator` identity made
# once under ./var/ (tokens in var/tokens/, owner-only; see executor/policy/local_identities.py).
# tests/integration/test_local_approvals.py starts its daemon with these same arguments.
RUN_ARGS := --policy policies/default.yaml --local-identities

run: $(STAMP)
	$(BIN)/execgate serve $(RUN_ARGS)

test: $(STAMP) test-ts test-deps
	$(BIN)/python -m pytest

# The npm MCP servers the tests run in the sandbox (tests/mcp_support.py), from their
# lockfile (tests/fixtures/mcp/npm); the PyPI ones (mcp-server-git, mcp-server-time) come
# with the `test` extra.
MCP_NPM := .test-deps/npm
MCP_LOCK := tests/fixtures/mcp/npm
test-deps: $(MCP_NPM)/.installed
$(MCP_NPM)/.installed: $(MCP_LOCK)/package.json $(MCP_LOCK)/package-lock.json
	mkdir -p $(MCP_NPM)
	cp $(MCP_LOCK)/package.json $(MCP_LOCK)/package-lock.json $(MCP_NPM)/
	npm ci --prefix $(MCP_NPM) --no-audit --no-fund --loglevel=error
	touch $@

# The daemon's Docker image, built offline (a debootstrap base, wheels from the host)
# and run: a call through its socket in its bwrap sandbox. Minutes; .ci/run runs it.
test-image: $(STAMP)
	$(BIN)/python -m pytest -m image

# The TypeScript client (client/typescript): install from its lockfile, generate the
# protobuf code and src/gen/runstates.ts from proto/ and compile, then its tests
# (node --test) against real daemons from this venv. pytest then runs
# tests/integration/test_cross_language.py and tests/integration/test_runstates.py on the build.
TS := client/typescript

test-ts: $(STAMP)
	cd $(TS) && npm ci --no-audit --no-fund --loglevel=error && npm run build && npm test

# Creates the venv and installs execgate (editable) with the test extras. Reinstalls
# when pyproject.toml, setup.py, a .proto or runstates.json changes, which regenerates
# execgate.v1 (protobuf code and execgate.v1.runstates).
$(STAMP): pyproject.toml setup.py $(PROTOS) $(RUNSTATES)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --progress-bar on -e '.[daemon,test]'
	touch $(STAMP)

install: $(STAMP)

proto: $(STAMP)
	$(BIN)/python -m pip install --quiet --no-deps -e .

# ruff (lint and format) and the import contracts of pyproject.toml's [tool.importlinter]:
# the daemon's rooms import only downward, no cycles, the client and the daemon apart.
# .pre-commit-config.yaml runs the same three.
lint: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	$(BIN)/ruff check executor client tests bench
	$(BIN)/ruff format --check executor client tests bench
	$(BIN)/lint-imports

# mypy checks the import names, so it runs from a tree of symlinks named like them
# (pyproject.toml maps the folders onto execgate.*). Generated execgate.v1 is not checked
# itself, but its types are read: execgate.v1.runstates is annotated for that.
MYPY_TREE := build/mypy/execgate

typecheck: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	rm -rf build/mypy
	mkdir -p $(MYPY_TREE)
	ln -s ../../../executor $(MYPY_TREE)/executor
	ln -s ../../../client $(MYPY_TREE)/client
	ln -s ../../../policies $(MYPY_TREE)/policies
	ln -s ../../../gen/execgate/v1 $(MYPY_TREE)/v1
	cd build/mypy && ../../$(BIN)/mypy --strict -p execgate.executor -p execgate.client

# The security corpus with long fuzzing budgets and more rounds of the path races
# (tests/security/conftest.py); `make test` runs the same tests with bounded budgets.
fuzz: $(STAMP)
	EXECGATE_FUZZ=1 $(BIN)/python -m pytest tests/security -p no:cacheprovider --timeout 3600

bench: $(STAMP)
	$(BIN)/python bench/dispatch.py
	$(BIN)/python bench/crashloop.py
	$(BIN)/python bench/schedule.py
	$(BIN)/python bench/cancel.py
	$(BIN)/python bench/loop.py
	$(BIN)/python bench/memory.py
	$(BIN)/python bench/tools.py
	$(BIN)/python bench/mcp_bridge.py
	$(BIN)/python bench/frameworks.py
	$(BIN)/python bench/fairness.py
	$(BIN)/python bench/load.py
	$(BIN)/python bench/pg.py

# Declared command tools and MCP servers alone (bench/tools.py, bench/README.md).
bench-tools: $(STAMP)
	$(BIN)/python bench/tools.py

clean:
	rm -rf $(VENV) gen build *.egg-info .pytest_cache .test-deps
	rm -rf $(TS)/node_modules $(TS)/dist $(TS)/src/gen
