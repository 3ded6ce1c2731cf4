# `make demo` and `make test` set up .venv from nothing when it is missing.
# CPU here: torch==2.13.0 (the CPU build). A CUDA user installs the torch build that matches
# their driver into .venv first and runs `make TORCH_SPEC= demo` (empty: keep that torch).
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.glmperf-installed

.PHONY: demo test lint bench clean-venv

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(if $(TORCH_SPEC),$(PY) -m pip install -q "$(TORCH_SPEC)")
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/profile-run --config configs/small.yaml
	$(VENV)/bin/glmperf recommend small --probe-budget 60

test: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m mypy

bench: $(STAMP)  # about 20 minutes on 2 quiet cores; results in benchmarks/results/
	for b in peer_hf_glm switch_effects attention_scaling overhead; do $(PY) -m benchmarks.$$b || exit 1; done

clean-venv:
	rm -rf $(VENV)
