# `make lab`: set up .venv and run the workshop.  `make test`: set up .venv and run every test.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Passed to `lab workshop`, e.g. make lab LAB_ARGS="--set train.max_steps=60"
LAB_ARGS ?=

.PHONY: lab test test-tools setup clean gpu-check

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -c constraints.txt -e '.[test]'
	@touch $(STAMP)

lab: $(STAMP)
	$(BIN)/lab workshop --config workshop-cpu $(LAB_ARGS)

test: $(STAMP) test-tools
	$(BIN)/python -m pytest

# The one-command device check (no venv needed: an NGC container's python3 will do). Without a GPU: a dry
# check that says what it skipped and exits 0. GPU_CHECK_OUT: where its logs and gpu-check.json go.
GPU_CHECK_OUT ?= runs/gpu-check
gpu-check:
	scripts/gpu-check.sh $(GPU_CHECK_OUT)

# Prometheus, promtool and the Pushgateway for the infrastructure tests (Debian packages).
test-tools:
	@scripts/install-test-tools.sh

clean:
	rm -rf $(VENV) .pytest_cache

# The images and compose files: static checks, then a real Docker engine (root + apt-get; see tests/infra/test_container.py).
.PHONY: test-container clean-container
test-container: $(STAMP)
	$(BIN)/python -m pytest tests/infra/test_compose.py tests/infra/test_container.py

# The container test's engine keeps its data root (~6 GB) in build/container/ as a cache.
clean-container:
	scripts/container-base.sh clean
