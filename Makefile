# Two entry points: `make demo` (the main job) and `make test` (the tests). Each builds its own virtual
# environment from nothing but the OS image; `make test` also installs the Debian packages its
# integration tests drive (Prometheus, promtool, Alertmanager, docker-compose) when they are absent.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch is what this project's machines carry; a matching pin keeps pip from pulling a
# multi-GB CUDA build when only the CPU is used.
TORCH_SPEC ?= torch==2.13.0
DEMO_ARGS ?=

.PHONY: demo test lint system-deps clean podresources

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

# Every tier, the timing tier too (which a plain pytest leaves out): tests/conftest.py runs it last.
test: $(VENV)/.stamp-dev system-deps lint
	$(VENV)/bin/python -m pytest -ra -m "timing or not timing" $(PYTEST_ARGS)

# The messages of the kubelet's PodResources API (exporter/kubernetes/podresources.proto) as Python,
# generated once and committed, like kubernetes-mixin's generated files: run this after changing the
# .proto. protoc runs in a tree where the file sits at its import path, inferwatch/exporter/kubernetes/,
# so that the descriptor's file name cannot clash with another api.proto in the process. No gRPC stubs
# are generated: the exporter calls the one method itself and decodes the answer (podresources.py says
# why), so the generated code needs only protobuf, not a grpcio as new as grpcio-tools.
PROTO_TREE := build/protoc
podresources: $(VENV)/.stamp-dev
	rm -rf $(PROTO_TREE) && mkdir -p $(PROTO_TREE)/inferwatch
	ln -s ../../../exporter $(PROTO_TREE)/inferwatch/exporter
	$(PY) -m grpc_tools.protoc -I$(PROTO_TREE) --python_out=$(PROTO_TREE) \
		$(PROTO_TREE)/inferwatch/exporter/kubernetes/podresources.proto
	rm -rf $(PROTO_TREE)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
