"""An embedding program that uses ExporterServer gets an OSError for an address it cannot listen on."""

from __future__ import annotations

import errno
import socket
import threading

import pytest
from inferwatch.exporter.errors import ListenError
from inferwatch.exporter.server import ExporterServer


def test_a_taken_port_raises_an_os_error_naming_the_address() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=rf"cannot listen on 127\.0\.0\.1:{port}: ") as caught:
            ExporterServer("127.0.0.1", port, exposition=None, ready=threading.Event())  # type: ignore[arg-type]
    assert isinstance(caught.value, ListenError)
    assert caught.value.errno == errno.EADDRINUSE
    assert caught.value.strerror == f"cannot listen on 127.0.0.1:{port}: Address already in use"


def test_a_free_port_is_listened_on() -> None:
    server = ExporterServer("127.0.0.1", 0, exposition=None, ready=threading.Event())  # type: ignore[arg-type]
    try:
        assert server.port > 0
    finally:
        server.server_close()
