# Two entry points on a fresh clone: `make run` (the main job) and `make test` (the suite).
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip

$(PY):
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip

.PHONY: run test install install-test lint
install: $(PY)
	$(PIP) install -q -e '.[nvidia]'

run: install
	$(VENV)/bin/gpuwise

# torch first, pinned to the CPU build on this disk, so no extra ever pulls a CUDA build.
install-test: $(PY)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[torch,nvidia,dev,checkpoints,prometheus,html,ray]'

test: install-test
	$(VENV)/bin/ruff check gpuwise tests benchmarks tools
	$(VENV)/bin/mypy gpuwise
	$(VENV)/bin/pytest -q --slow -rs

lint: install-test
	$(VENV)/bin/ruff check gpuwise tests benchmarks tools
	$(VENV)/bin/mypy gpuwise
