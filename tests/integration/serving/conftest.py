"""The ``transformers serve`` servers the serving tests share: started once for the package, each server
under ``inferwatch run`` (:mod:`tests.support.transformers_serve`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.servemodel import write_serve_model
from tests.support.transformers_serve import MAX_POSITIONS, Server, serve, serve_has_option, stream_chat


@pytest.fixture(scope="package")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the package, its model forced (loaded at start, never unloaded)."""
    workdir = tmp_path_factory.mktemp("transformers-serve")
    model_dir = write_serve_model(workdir / "model", max_positions=MAX_POSITIONS)
    with serve(workdir, model_dir, force_model=True, model_timeout=600, name="serve") as running:
        yield running


@pytest.fixture(scope="package")
def batching_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``transformers serve --continuous-batching``: one manager thread schedules every request's prompt
    and decode tokens together in paged-attention steps; ``generate`` is never called."""
    workdir = tmp_path_factory.mktemp("transformers-serve-cb")
    model_dir = write_serve_model(workdir / "model")
    # On the CPU transformers sizes the paged cache from free host memory, and its batch buffers from the
    # tokens a step may hold: 15.7 GB of this 24 GB machine with transformers 5.17 (the kernel's OOM killer
    # took it), 4.9 GB with 5.25. 512 blocks and 512 tokens a step hold more than the four clients' prompts
    # and answers need: 0.66 GB.
    options = ("--continuous-batching", "--cb-num-blocks=512", "--cb-max-batch-tokens=512")
    with serve(
        workdir, model_dir, force_model=True, model_timeout=600, name="serve-cb", options=options
    ) as running:
        yield running


@pytest.fixture(scope="package")
def api_servers_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """``transformers serve DIR --api-server-count 2`` (5.25 on): two API processes take the HTTP requests
    and tokenize, one engine process runs the model; skipped where the installed transformers serve has
    no such option."""
    if not serve_has_option("--api-server-count"):
        pytest.skip("this transformers serve has no --api-server-count")
    workdir = tmp_path_factory.mktemp("transformers-serve-api2")
    model_dir = write_serve_model(workdir / "model")
    options = ("--api-server-count=2",)
    with serve(
        workdir, model_dir, force_model=True, model_timeout=600, name="serve-api2", options=options
    ) as running:
        # One request per API process before any test's: a freshly spawned API server's first answer paid
        # ~190 ms of its own start-up between the client and the middleware, which no test measures.
        client = running.client()
        for _ in range(2):
            stream_chat(client, running.model, "warm up", max_tokens=2)
        yield running
