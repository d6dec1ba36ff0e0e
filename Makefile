# Two commands on a fresh machine (as root): `make demo` deploys to the lab, `make test` runs every test.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test unit lab-test lint down

$(BIN)/pyinfra: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[test]'
	touch $@

setup: $(BIN)/pyinfra
	bash tests/lab/setup-machine.sh

demo: setup
	$(BIN)/python -m tests.lab demo

lint: $(BIN)/pyinfra
	$(BIN)/ruff check .

unit: $(BIN)/pyinfra
	$(BIN)/pytest -q tests/unit

lab-test: setup
	$(BIN)/pytest -q tests/integration

test: lint unit lab-test

down: $(BIN)/pyinfra
	$(BIN)/python -m tests.lab down
