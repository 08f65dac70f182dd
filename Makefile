# txmq: the one entry point. `make run` starts the services locally with a demo; `make test`
# runs every test. Both install what they need into ./.venv and ./tools/node_modules.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BUF := tools/node_modules/.bin/buf
PROTOS := $(wildcard protos/txmq/v1/*.proto)
DATA_DIR ?= ./data

.PHONY: all venv tools proto proto-lint proto-check run demo test test-unit test-integration bench clean distclean

all: test

# The virtual environment: pinned requirements, the SDK and the services installed editable.
$(VENV)/.installed: requirements/runtime.txt requirements/dev.txt sdk/pyproject.toml pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements/dev.txt
	$(PY) -m pip install --quiet --no-deps -e sdk -e .
	touch $@

venv: $(VENV)/.installed

# buf (proto lint) from npm, pinned in tools/package.json.
$(BUF): tools/package.json
	cd tools && npm install --no-audit --no-fund --silent
	touch $@

tools: $(BUF)

# The only producer of generated code: Python stubs into the SDK package.
proto: venv
	rm -f sdk/txmq/v1/*_pb2.py sdk/txmq/v1/*_pb2.pyi sdk/txmq/v1/*_pb2_grpc.py
	$(PY) -m grpc_tools.protoc -I protos --python_out=sdk --pyi_out=sdk --grpc_python_out=sdk $(PROTOS)

proto-lint: tools
	cd protos && ../$(BUF) lint

# Fails when the checked-in stubs differ from what `make proto` produces.
proto-check: venv
	tools/check_generated.sh $(PY)

run: venv
	$(PY) -m services.local --data-dir $(DATA_DIR)

test: venv proto-lint proto-check
	$(PY) -m pytest tests

test-unit: venv
	$(PY) -m pytest tests/unit

test-integration: venv
	$(PY) -m pytest tests/integration

bench: venv
	$(PY) -m bench.transactions
	$(PY) -m bench.checks

clean:
	rm -rf $(DATA_DIR) .pytest_cache

distclean: clean
	rm -rf $(VENV) tools/node_modules
