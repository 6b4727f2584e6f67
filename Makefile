# One-command set-up: `make demo` and `make test` each build .venv if missing, install what they
# need, then do their job. torch is installed first, pinned to the CPU wheel on this machine's disk,
# so that nothing that depends on it pulls a multi-GB CUDA build.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.cache/torch_extensions
export MLFLOW_DISABLE_TELEMETRY := true
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export DS_BUILD_OPS := 0
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: install demo test lint synth bench clean sim-native

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[agent,cdk,dev]'
	touch $(STAMP)

# the simulator's modules compiled by mypyc (spotrelay/sim_native.py): the same source, ~1.25x faster sweeps;
# rebuilt when any module changes (until then `spotrelay simulate` runs the source, never a stale build)
SIM_NATIVE := build/sim-native/manifest.json
$(SIM_NATIVE): $(STAMP) pyproject.toml $(shell find spotrelay -name '*.py')
	$(BIN)/python -m spotrelay.sim_native build

sim-native: $(SIM_NATIVE)

# set-up and the demo go on without it (the simulator then runs from source, and says so); `make test` needs it
install: $(STAMP)
	-@$(MAKE) --no-print-directory sim-native

demo: $(STAMP)
	-@$(MAKE) --no-print-directory sim-native
	$(BIN)/spotrelay demo --out demo-out --json demo-out/summary.json

# checkov (pinned in tests/infrastructure/checkov_env.py) has its own venv: its dependencies conflict with ours
CHECKOV := .cache/checkov-venv/bin/checkov
$(CHECKOV): tests/infrastructure/checkov_env.py | $(STAMP)
	$(BIN)/python -m tests.infrastructure.checkov_env

test: $(STAMP) $(CHECKOV) $(SIM_NATIVE)
	$(BIN)/ruff check .
	SPOTRELAY_SIM_NATIVE_REQUIRED=1 $(BIN)/pytest -q --durations=40 tests

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy spotrelay functions agent cdk

synth: $(STAMP)
	$(BIN)/python app.py

bench: $(STAMP)
	$(BIN)/spotrelay local chaos --jobs 28 --seed 7 --max-faults 200 --parallel 2 --steps 150 --job-timeout 1800 --out bench-out/chaos --json bench-out/chaos.json
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/checkpoint.py --engine deepspeed
	$(BIN)/python bench/notice_window.py
	$(BIN)/python bench/coldstart.py
	$(BIN)/python bench/health.py

clean:
	rm -rf $(VENV) cdk.out .cache demo-out build/sim-native build/sim-native.*
