# Two entry points for a fresh machine: `make demo` and `make test`. Each sets everything up first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lossguard-installed

.PHONY: setup demo test test-all lint bench

setup: $(STAMP)

# torch is installed first and pinned: the CPU build of 2.13.0 is the one on this machine's wheel path,
# and asking for it before anything else keeps pip from ever pulling a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@echo "setting up $(VENV) (CPU torch 2.13.0, DeepSpeed, transformers; a few minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	@# pip's log goes to a file (this machine's index configuration makes it chatty); shown on failure.
	@$(PY) -m pip install -q torch==2.13.0 > $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	@$(PY) -m pip install -q -e '.[train,dev]' 'torch==2.13.0' >> $(VENV)/pip.log 2>&1 || { cat $(VENV)/pip.log; exit 1; }
	touch $(STAMP)

demo: setup
	$(VENV)/bin/lossguard demo

test: setup
	bash scripts/install_browser.sh
	$(PY) -m pytest -q

test-all: setup
	bash scripts/install_browser.sh
	$(PY) -m pytest -q -m ''

lint: setup
	$(VENV)/bin/ruff check src tests bench scripts examples
