# The README's two commands: `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: demo test lint typecheck pytest bench bench-churn bench-fuzz bench-tools clean chromium \
	sandbox-python bench-coding bench-spawn

$(STAMP): pyproject.toml envs/echo_env/pyproject.toml envs/counter_env/pyproject.toml \
		envs/coding_env/pyproject.toml envs/gymnasium_env/pyproject.toml envs/wordle_env/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "openenv needs Python >= 3.11 (PYTHON=$(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,mcp,gymnasium]' -e envs/echo_env -e envs/counter_env \
		-e envs/coding_env -e envs/gymnasium_env -e envs/wordle_env
	@touch $@

demo: $(STAMP)
	$(BIN)/openenv demo --app-dir envs/echo_env --app server.app:app --sessions 256 --steps 50

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) chromium sandbox-python
	$(BIN)/pytest --doctest-modules src tests envs

# Benchmarks print their numbers; benchmarks/RESULTS.md records them with these commands.
bench: bench-churn bench-fuzz bench-tools bench-coding bench-spawn

bench-churn: $(STAMP)
	$(BIN)/python benchmarks/churn.py --sessions 100000 --concurrency 256

bench-fuzz: $(STAMP)
	$(BIN)/python benchmarks/fuzz_volume.py --examples 20000

# The web page tests drive Debian's Chromium; Playwright never downloads a browser.
chromium:
	@test -x /usr/bin/chromium || { apt-get update -q && apt-get install -y -q chromium; }

# coding_env runs programs under unprivileged uids when the server is root; they
# need an interpreter outside /root (a pyenv or venv Python there is private).
sandbox-python:
	@test -x /usr/bin/python3 || { apt-get update -q && apt-get install -y -q python3-minimal; }

bench-tools: $(STAMP)
	$(BIN)/python benchmarks/tool_sessions.py --sessions 1000 --mcp-sessions 50

bench-coding: $(STAMP) sandbox-python
	$(BIN)/python benchmarks/coding_sessions.py --sessions 200 --sleep 2

bench-spawn: $(STAMP) sandbox-python
	$(BIN)/python benchmarks/spawn_lag.py --processes 200 --rounds 2

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
