# The course's two commands (see README.md):
#   make lab    set up .venv and open the course in JupyterLab
#   make test   set up .venv and run every test: unit tests and all notebooks under nbval
#
# .venv sees the interpreter's own site-packages, so a torch that is already
# installed there (CPU or CUDA build) is used as it is, never reinstalled.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# Two processes by default (a CI machine has 2 cores); `loadgroup` keeps each notebook in one process, in order
# (tests/conftest.py), and hands every other test to whichever process is free.
PYTEST_ARGS ?= -n 2 --dist loadgroup
STAMP := $(VENV)/.installed

.PHONY: setup lab test clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

lab: setup
	$(BIN)/python -m jupyter lab $(LAB_ARGS) notebooks/

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV)
