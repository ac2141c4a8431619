"""The transformers serve integration: the layout chosen by what the modules have, and an unknown one said."""

from __future__ import annotations

import logging
import sys
import types

import pytest
import transformers
from prometheus_client import REGISTRY

from inferwatch.instrumentation.launcher import transformers_serve
from tests.support import sample_value


@pytest.fixture
def info_reset():
    yield
    transformers_serve._info.labels = None  # the process's default registry serves nothing of it again


@pytest.mark.matrix
def test_the_installed_transformers_has_exactly_one_known_layout() -> None:
    # Fails on a transformers whose serve layout no integration knows (make compat says so first).
    pytest.importorskip("fastapi")
    import transformers.cli.serving.model_manager as manager
    import transformers.cli.serving.utils as utils

    known = [layout.NAME for layout in transformers_serve.LAYOUTS if layout.detect(utils, manager)]
    assert len(known) == 1, f"transformers {transformers.__version__}: layouts {known}"


@pytest.mark.usefixtures("info_reset")
def test_an_unknown_layout_is_said_once_and_on_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # A release that renamed what the integrations hook: modules with none of their names.
    utils = types.ModuleType(transformers_serve.UTILS_MODULE)
    manager = types.ModuleType(transformers_serve.MANAGER_MODULE)
    monkeypatch.setitem(sys.modules, transformers_serve.UTILS_MODULE, utils)
    monkeypatch.delenv("INFERWATCH_SERVER_PID", raising=False)
    with caplog.at_level(logging.WARNING, logger="inferwatch.run"):
        assert transformers_serve.on_manager_module(manager) == transformers_serve.UNKNOWN
    lines = [r.getMessage() for r in caplog.records if "layout inferwatch does not know" in r.getMessage()]
    assert len(lines) == 1
    assert f"transformers {transformers.__version__}'s" in lines[0]
    assert "models are measured at generate and forward" in lines[0]
    from prometheus_client.exposition import generate_latest

    body = generate_latest(REGISTRY).decode()
    assert (
        sample_value(
            body,
            "inferwatch_run_serve_integration_info",
            integration="unknown",
            coverage="partial",
            transformers_version=transformers.__version__,
        )
        == 1
    )


@pytest.mark.usefixtures("info_reset")
def test_a_process_that_is_not_the_first_does_not_say_it_again(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, transformers_serve.UTILS_MODULE, types.ModuleType("u"))
    monkeypatch.setenv("INFERWATCH_SERVER_PID", "1")  # another process serves the endpoint
    with caplog.at_level(logging.WARNING, logger="inferwatch.run"):
        transformers_serve.on_manager_module(types.ModuleType("m"))
    assert not [r for r in caplog.records if "does not know" in r.getMessage()]
    assert transformers_serve._info.labels["coverage"] == "partial"
