# The README's two commands: `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint typecheck pytest bench clean

$(STAMP): pyproject.toml envs/echo_env/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "openenv needs Python >= 3.11 (PYTHON=$(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]' -e envs/echo_env
	@touch $@

demo: $(STAMP)
	$(BIN)/openenv demo --app-dir envs/echo_env --app server.app:app --sessions 256 --steps 50

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint --no-color Dockerfile templates/env/server/Dockerfile envs/*/server/Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest --doctest-modules src tests envs

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
