# Two entry points: `make demo` (the main job) and `make test` (the tests). Each builds its own virtual
# environment from nothing but the OS image; `make test` also installs the Debian packages its
# integration tests drive (Prometheus, promtool, Alertmanager, VictoriaMetrics and vmalert, docker-compose)
# when they are absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is what this project's machines carry; a matching pin keeps pip from pulling a
# multi-GB CUDA build when only the CPU is used.
TORCH_SPEC ?= torch==2.13.0
DEMO_ARGS ?=

.PHONY: demo test lint system-deps clean podresources matrix compat

$(VENV)/.stamp-run: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e '.[all]'
	touch $@

$(VENV)/.stamp-dev: $(VENV)/.stamp-run
	$(PY) -m pip install -q -e '.[all,dev]'
	touch $@

# Serves the demo's metrics on http://127.0.0.1:8797/metrics, inferwatch's default port (not 8000, which
# vLLM and FastAPI apps take: docs/serving.md, "Default ports"); `make demo DEMO_ARGS=--port=N` for another.
demo: $(VENV)/.stamp-run
	$(VENV)/bin/inferwatch demo $(DEMO_ARGS)

system-deps:
	bash scripts/install-system-deps.sh

lint: $(VENV)/.stamp-dev
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# guidellm, the third-party load generator the serving tests drive (tests/support/guidellm.py), in a venv
# of its own: in the project's it would change click and bring uvloop and websockets, which uvicorn then
# uses in every server under test. Its torch is pinned as the project's is (unpinned, pip takes a CUDA build).
GUIDELLM_VENV := .venv-guidellm
$(GUIDELLM_VENV)/.stamp:
	$(PYTHON) -m venv $(GUIDELLM_VENV)
	$(GUIDELLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(GUIDELLM_VENV)/bin/python -m pip install -q "$(TORCH_SPEC)" guidellm==0.8.1
	touch $@

# Every tier, the timing tier too (which a plain pytest leaves out): tests/conftest.py runs it last. That
# run is the matrix's newest transformers with torch $(TORCH_SPEC); the version matrix follows it.
test: $(VENV)/.stamp-dev $(GUIDELLM_VENV)/.stamp system-deps lint
	$(VENV)/bin/python -m pytest -ra -m "timing or not timing" $(PYTEST_ARGS)
	$(MAKE) --no-print-directory matrix

# The version matrix (README, "Tested versions"): the tests marked `matrix` (generate, continuous
# batching, speculative decoding, transformers serve with the openai client) again in one venv per
# cell, .venv-matrix/tf<transformers>-torch<torch>/, each installed from pyproject with both pinned.
# With .venv (transformers 5.25, torch 2.13) the cells cover the oldest supported transformers, 5.24 and
# 5.25, and torch 2.13 and the newest torch. PyPI's Linux torch above 2.13 is a CUDA build (2.15.0: about
# 5.3 GB in the venv, 75 s to install here) that runs on the CPU. A machine-wide pip cap on torch (this
# project's machines: /etc/xdg/pip/constraints.txt, torch<=2.14.1) would refuse the newest, so these pip
# runs take no constraint file: every cell pins its torch exactly. The timing tier stays with `make test`.
MATRIX_DIR ?= .venv-matrix
MATRIX_CELLS ?= tf5.17.0-torch2.13.0 tf5.24.0-torch2.13.0 tf5.25.0-torch2.15.0
MATRIX_MARK := matrix and not timing
MATRIX_PIP := PIP_CONSTRAINT=/dev/null
# A cell's tests took 8-10 min here (2 cores, shared); a run left hanging at exit (a test that failed
# before stopping a continuous-batching manager's non-daemon thread) fails its cell after this many seconds.
MATRIX_CELL_TIMEOUT ?= 1500

# $* is the cell: tf<transformers>-torch<torch>.
$(MATRIX_DIR)/%/.stamp: pyproject.toml
	rm -rf $(MATRIX_DIR)/$*
	$(PYTHON) -m venv $(MATRIX_DIR)/$*
	$(MATRIX_PIP) $(MATRIX_DIR)/$*/bin/python -m pip install -q --upgrade pip
	cell=$*; tf=$${cell%%-torch*}; tf=$${tf#tf}; torch=$${cell##*-torch}; \
	$(MATRIX_PIP) $(MATRIX_DIR)/$*/bin/python -m pip install -q "torch==$$torch" && \
	$(MATRIX_PIP) $(MATRIX_DIR)/$*/bin/python -m pip install -q -e '.[all,dev]' \
		"torch==$$torch" "transformers[serving]==$$tf"
	touch $@

# Every cell runs, each result printed under its name; the target fails if any cell failed.
matrix: $(foreach cell,$(MATRIX_CELLS),$(MATRIX_DIR)/$(cell)/.stamp) $(GUIDELLM_VENV)/.stamp
	@failed=""; for cell in $(MATRIX_CELLS); do \
		echo "=== matrix cell $$cell: $$($(MATRIX_DIR)/$$cell/bin/python -c 'import torch, transformers; \
			print("transformers", transformers.__version__, "torch", torch.__version__)')"; \
		timeout $(MATRIX_CELL_TIMEOUT) $(MATRIX_DIR)/$$cell/bin/python -m pytest -ra -m "$(MATRIX_MARK)" \
			$(PYTEST_ARGS) || failed="$$failed $$cell"; \
	done; \
	if [ -n "$$failed" ]; then echo "=== matrix cells FAILED:$$failed"; exit 1; fi; \
	echo "=== matrix: every cell passed ($(MATRIX_CELLS))"

# A maintainer's check against what PyPI has now: `make compat` (newest transformers, torch $(TORCH_SPEC)),
# `make compat TRANSFORMERS=5.26.0 TORCH=latest`. Builds a throwaway venv, .venv-compat/, every time.
TRANSFORMERS ?= latest
TORCH ?= $(patsubst torch==%,%,$(TORCH_SPEC))
COMPAT_VENV := .venv-compat
compat_pin = $(if $(filter latest,$(2)),$(1),$(1)==$(2))
compat: $(GUIDELLM_VENV)/.stamp
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(MATRIX_PIP) $(COMPAT_VENV)/bin/python -m pip install -q --upgrade pip
	$(MATRIX_PIP) $(COMPAT_VENV)/bin/python -m pip install -q --upgrade "$(call compat_pin,torch,$(TORCH))"
	$(MATRIX_PIP) $(COMPAT_VENV)/bin/python -m pip install -q --upgrade -e '.[all,dev]' \
		"$$($(COMPAT_VENV)/bin/python -c 'import torch; print("torch==" + torch.__version__)')" \
		"$(call compat_pin,transformers[serving],$(TRANSFORMERS))"
	@echo "=== compat: $$($(COMPAT_VENV)/bin/python -c 'import torch, transformers; \
		print("transformers", transformers.__version__, "torch", torch.__version__)')"
	$(COMPAT_VENV)/bin/python -m pytest -ra -m "$(MATRIX_MARK)" $(PYTEST_ARGS)

# The messages of the kubelet's PodResources API (src/inferwatch/exporter/kubernetes/podresources.proto) as
# Python, generated once and committed, like kubernetes-mixin's generated files: run this after changing the
# .proto. Under src/ the file sits at its import path, inferwatch/exporter/kubernetes/, so the descriptor's
# file name cannot clash with another api.proto in the process. No gRPC stubs are generated: the exporter
# calls the one method itself and decodes the answer (podresources.py says why), so the generated code needs
# only protobuf, not a grpcio as new as grpcio-tools.
podresources: $(VENV)/.stamp-dev
	$(PY) -m grpc_tools.protoc -Isrc --python_out=src src/inferwatch/exporter/kubernetes/podresources.proto

clean:
	rm -rf $(VENV) $(MATRIX_DIR) $(COMPAT_VENV) $(GUIDELLM_VENV) .pytest_cache .ruff_cache
