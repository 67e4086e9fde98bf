# The README's two commands: `make demo` and `make test`. Both install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# setuptools notes every editable install of a package whose folder is the
# package itself (each env in envs/, so `uvicorn server.app:app` works from it)
# with a boxed "Editable installation" message; it is information, not a fault.
QUIET_EDITABLE := PYTHONWARNINGS="ignore:Editable installation"

.PHONY: demo test venvs test-min lint typecheck pytest bench bench-runtime bench-servers bench-churn bench-fuzz \
	test-pythons bench-tools bench-coding bench-spawn bench-workers bench-pool bench-recording bench-fleet bench-straggler bench-multiplex bench-mux-turns bench-v2-path bench-handoff bench-callgrind clean chromium sandbox-python \
	openreward-sdk openenv-peer

$(STAMP): pyproject.toml envs/*/pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "openenv needs Python >= 3.11 (PYTHON=$(PYTHON))"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@# The distribution was once named `openenv`, which on PyPI is Hugging Face's OpenEnv:
	@# an old install of that name would keep shadowing this checkout's scripts.
	$(BIN)/pip uninstall --quiet --yes openenv 2>/dev/null || true
	$(QUIET_EDITABLE) $(BIN)/pip install --quiet -e '.[dev,mcp,bench,ray,spark,gymnasium,report,parquet]' -e envs/echo_env \
		-e envs/counter_env -e envs/benchmark_env -e envs/coding_env -e envs/gymnasium_env \
		-e envs/wordle_env
	@touch $@

# The floors pyproject.toml declares, really installed and tested: a second venv
# with every runtime dependency and user extra pinned to its floor (the dev tools
# are ours and stay current). .ci/min_constraints.py derives the pins.
VENV_MIN := .venv-min
MIN_STAMP := $(VENV_MIN)/.installed
MIN_EXTRAS := ray spark mcp bench gymnasium report parquet

$(MIN_STAMP): pyproject.toml envs/*/pyproject.toml .ci/min_constraints.py
	rm -rf $(VENV_MIN)
	$(PYTHON) -m venv $(VENV_MIN)
	$(VENV_MIN)/bin/pip install --quiet --upgrade pip
	$(PYTHON) .ci/min_constraints.py $(MIN_EXTRAS) > $(VENV_MIN)/constraints.txt
	$(QUIET_EDITABLE) $(VENV_MIN)/bin/pip install --quiet -c $(VENV_MIN)/constraints.txt \
		-e '.[dev,mcp,bench,ray,spark,gymnasium,report,parquet]' -e envs/echo_env \
		-e envs/counter_env -e envs/benchmark_env -e envs/coding_env -e envs/gymnasium_env \
		-e envs/wordle_env
	@touch $@

# OpenReward's real SDK, which tests/test_openreward_sdk.py drives, in a venv of its
# own: it pins sse-starlette==2.3.6 and the mcp extra needs >=3. From PyPI only.
VENV_OR := .venv-openreward
OR_STAMP := $(VENV_OR)/.installed

# A peer's venv: $(1) the folder, $(2) its requirements file.
define peer_venv
	rm -rf $(1)
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade pip
	$(1)/bin/pip install --quiet -r $(2)
	@touch $(1)/.installed
endef

$(OR_STAMP): tests/apps/openreward_requirements.txt
	$(call peer_venv,$(VENV_OR),$<)

openreward-sdk: $(OR_STAMP)

# Hugging Face's OpenEnv, whose real client tests/test_openenv_peer_client.py drives:
# it imports as `openenv` too, so it lives apart. Built once, not on every run.
VENV_PEER := .venv-openenv-peer
PEER_STAMP := $(VENV_PEER)/.installed

$(PEER_STAMP): tests/apps/openenv_peer_requirements.txt
	$(call peer_venv,$(VENV_PEER),$<)

openenv-peer: $(PEER_STAMP)

# Two pytest workers, each taking whole modules (a module's fixtures, such as its
# two-node Ray cluster, stay in one process): most tests wait on servers, clusters
# and deadlines, so two cores run the suite in about half the time of one worker.
PYTEST_WORKERS ?= 2
PYTEST_PARALLEL := $(if $(filter-out 0 1,$(PYTEST_WORKERS)),-n $(PYTEST_WORKERS) --dist loadfile)

test-min: $(MIN_STAMP) chromium sandbox-python $(OR_STAMP) $(PEER_STAMP)
	$(VENV_MIN)/bin/pytest -q -p no:cacheprovider $(PYTEST_PARALLEL) --doctest-modules src tests envs

demo: $(STAMP)
	$(BIN)/openenv demo --app-dir envs/echo_env --app server.app:app --sessions 256 --steps 50

test: venvs lint typecheck pytest test-min

# Every venv the suites use, built side by side (pip mostly waits on the disk): a
# minute less than one after another on two cores.
venvs:
	@$(MAKE) --no-print-directory -j4 $(STAMP) $(MIN_STAMP) $(OR_STAMP) $(PEER_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/hadolint --no-color Dockerfile templates/env/server/Dockerfile envs/*/server/Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) chromium sandbox-python $(OR_STAMP) $(PEER_STAMP)
	$(BIN)/pytest $(PYTEST_PARALLEL) --doctest-modules src tests envs

# Benchmarks print their numbers; benchmarks/RESULTS.md records them with these commands.
bench: bench-servers bench-runtime bench-churn bench-fuzz test-pythons bench-tools bench-coding bench-spawn \
	bench-workers bench-pool bench-recording bench-fleet bench-straggler bench-multiplex bench-mux-turns \
	bench-v2-path bench-handoff

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

# Closed-loop load against our server, OpenEnv, bare echo servers and our server as it
# was at BASELINE (the revision speed is held against; BASELINE= leaves it out); see benchmarks/.
BASELINE ?= c40abeb
bench-servers: $(STAMP)
	$(BIN)/python benchmarks/run.py $(if $(BASELINE),--baseline $(BASELINE))

# Runners on every engine against a hand-written asyncio.gather floor.
bench-runtime: $(STAMP)
	$(BIN)/python benchmarks/runtime_bench.py

# Dynamic dispatch: 64 tasks, 8 ten times slower, on 4 workers; against ideal and a fixed split.
bench-straggler: $(STAMP)
	$(BIN)/python benchmarks/straggler.py

# Protocol v2 against v1, RemoteVectorEnv against SyncVectorEnv, 16,384 sessions; v2 and the
# vector session also as they were at MUX_BASELINE, the previous session's main
# (MUX_BASELINE= leaves them out).
MUX_BASELINE ?= 99e26c6
bench-multiplex: $(STAMP)
	$(BIN)/python benchmarks/multiplex.py $(if $(MUX_BASELINE),--baseline $(MUX_BASELINE))

# The echo v2/v1 ratio over many short turns of both loads on one server: median and spread.
bench-mux-turns: $(STAMP)
	$(BIN)/python benchmarks/mux_turns.py

# The loop thread's CPU per v2 step without sockets, this tree against MUX_BASELINE.
bench-v2-path: $(STAMP)
	$(BIN)/python benchmarks/v2_path.py $(if $(MUX_BASELINE),--baseline $(MUX_BASELINE))

# Instructions per echo step through v2's thread hand-over (callgrind), this tree against MUX_BASELINE.
bench-handoff: $(STAMP)
	$(BIN)/python benchmarks/handoff_path.py $(if $(MUX_BASELINE),--baseline $(MUX_BASELINE))

bench-coding: $(STAMP) sandbox-python
	$(BIN)/python benchmarks/coding_sessions.py --sessions 200 --sleep 2

# One server on every core: 1 vs 2 workers, how connections spread, 32,768 sleeping sessions.
bench-workers: $(STAMP)
	$(BIN)/python benchmarks/workers.py

# What a ServerPool costs against the same load straight at one server.
bench-pool: $(STAMP)
	$(BIN)/python benchmarks/pool.py

# What recording every session (create_app(record=...)) costs a run of short episodes.
bench-recording: $(STAMP)
	$(BIN)/python benchmarks/recording.py

# A Ray fleet's cost per step against the same load straight at one server.
bench-fleet: $(STAMP)
	$(BIN)/python benchmarks/fleet.py

bench-spawn: $(STAMP) sandbox-python
	$(BIN)/python benchmarks/spawn_lag.py --processes 200 --rounds 2

# The suites that drive async steps (eager tasks from Python 3.12; 3.11 enters the
# session's task instead, server/direct_steps.py), on each pyenv 3.12 and 3.13
# found (docs/dependencies.md). Not part of `make test`: CI's Python is 3.11, where
# tests/test_async_direct_steps.py also runs every test with a task per step.
PY_SUITES := tests/test_async_direct_steps.py tests/test_direct_steps.py tests/test_deadlines.py \
	tests/test_multiplex.py tests/test_isolation.py tests/test_wsprotocol.py tests/test_session_core.py
test-pythons:
	@found=$$(ls -d $(HOME)/.pyenv/versions/3.12.* $(HOME)/.pyenv/versions/3.13.* 2>/dev/null); \
	test -n "$$found" || { echo "no pyenv CPython 3.12 or 3.13 found"; exit 1; }; \
	for py in $$found; do \
		v=.venv-$$(basename $$py); \
		test -x $$v/bin/pytest || { $$py/bin/python -m venv $$v && $$v/bin/pip install --quiet --upgrade pip && \
			$(QUIET_EDITABLE) $$v/bin/pip install --quiet -e '.[dev]' -e envs/echo_env \
			-e envs/counter_env -e envs/benchmark_env; } || exit 1; \
		echo "== $$py"; $$v/bin/pytest -q -p no:cacheprovider $(PY_SUITES) || exit 1; \
	done

# Instructions per echo step under callgrind (valgrind): steady where the machine's
# speed is not. BASELINE=REV also counts that revision's (exported by run.py).
bench-callgrind: $(STAMP)
	benchmarks/callgrind_steps.sh this "" 18990
	@if [ -n "$(BASELINE)" ]; then \
		src=$$($(BIN)/python -c "import sys; sys.path.insert(0, 'benchmarks'); from run import export_src; print(export_src('$(BASELINE)'))" | tail -1); \
		benchmarks/callgrind_steps.sh $(BASELINE) "$$src" 18991; \
	fi

clean:
	rm -rf $(VENV) $(VENV_MIN) $(VENV_OR) .venv-3.1[23].* .pytest_cache .mypy_cache .ruff_cache
