"""A real uvicorn serving an ASGI app in a thread of the test process, on a loopback port."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from tests.support.services import wait_until


@contextmanager
def serve_asgi(app: Any) -> Iterator[str]:
    """The app's base URL on a real uvicorn in a thread, on a loopback port bound here (no race for a free
    port); stopped as a signal would (``should_exit``), and joined."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, lifespan="off", log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="uvicorn", daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started or not thread.is_alive(), 30, "uvicorn to start", interval=0.02)
        assert server.started, "uvicorn exited before it started"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not shut down"
