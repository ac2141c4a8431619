"""The HTTP endpoint: metrics, health, readiness, and a landing page; TLS and basic auth when configured.

A thread per connection (``ThreadingHTTPServer``) keeps one slow client from holding up another; an idle
or stalled connection is dropped after :attr:`_Handler.timeout`, so threads cannot pile up. TLS
handshakes run on the connection's thread, not the accepting one, for the same reason.
"""

from __future__ import annotations

import gzip
import logging
import socket
import ssl
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from .errors import ListenError
from .exposition import Exposition
from .webconfig import WebConfig

log = logging.getLogger(__name__)

_LANDING = """<!DOCTYPE html>
<html><head><title>inferwatch exporter</title></head>
<body><h1>inferwatch exporter</h1>
<p>GPU (NVML), host and serving-process metrics for LLM inference.</p>
<ul><li><a href="{path}">{path}</a></li><li><a href="/-/healthy">/-/healthy</a></li>
<li><a href="/-/ready">/-/ready</a></li></ul></body></html>
"""


class ExporterServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        host: str,
        port: int,
        exposition: Exposition,
        ready: threading.Event,
        telemetry_path: str = "/metrics",
        web: WebConfig | None = None,
    ) -> None:
        """Bind and listen; raises :class:`.errors.ListenError` (an ``OSError``, with the failed bind's
        ``errno``) when the address cannot be used."""
        self.exposition = exposition
        self.ready = ready
        self.telemetry_path = telemetry_path
        self.web = web or WebConfig()
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            super().__init__((host or "0.0.0.0", port), _Handler)
        except OSError as exc:
            raise ListenError(exc.errno, f"cannot listen on {shown}: {exc.strerror or exc}") from None

    @property
    def port(self) -> int:
        return self.server_address[1]

    def get_request(self) -> tuple[socket.socket, object]:
        sock, address = super().get_request()
        if self.web.ssl_context is not None:
            sock = self.web.ssl_context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, address

    def handle_error(self, request: object, client_address: object) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError, ssl.SSLError)):
            # Clients that hang up, fail the handshake or time out are routine for a server on a network.
            log.debug("connection from %s failed: %r", client_address, error)
        else:
            log.error("answering %s failed", client_address, exc_info=error)


class _Handler(BaseHTTPRequestHandler):
    server: ExporterServer
    protocol_version = "HTTP/1.1"
    timeout = 30  # seconds a connection may stay silent before it is dropped

    def setup(self) -> None:
        super().setup()
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()

    def do_GET(self) -> None:
        self._serve(send_body=True)

    def do_HEAD(self) -> None:
        self._serve(send_body=False)

    def _serve(self, send_body: bool) -> None:
        auth = self.server.web.auth
        if auth is not None and not auth.check(self.headers.get("Authorization")):
            self._reply(401, b"Unauthorized\n", extra={"WWW-Authenticate": 'Basic realm="inferwatch"'})
            return
        path = urlsplit(self.path).path
        if path == self.server.telemetry_path:
            self._metrics(send_body)
        elif path == "/-/healthy":
            self._reply(200, b"Healthy\n", send_body=send_body)
        elif path == "/-/ready":
            if self.server.ready.is_set():
                self._reply(200, b"Ready\n", send_body=send_body)
            else:
                self._reply(503, b"Not ready: no collection has finished yet\n", send_body=send_body)
        elif path == "/":
            page = _LANDING.format(path=self.server.telemetry_path).encode()
            self._reply(200, page, "text/html; charset=utf-8", send_body=send_body)
        else:
            self._reply(404, b"Not found\n", send_body=send_body)

    def _metrics(self, send_body: bool) -> None:
        body, content_type = self.server.exposition.render(self.headers.get("Accept"))
        extra = {}
        if "gzip" in (self.headers.get("Accept-Encoding") or ""):
            body = gzip.compress(body, compresslevel=1)
            extra["Content-Encoding"] = "gzip"
        self._reply(200, body, content_type, extra, send_body)

    def _reply(
        self,
        status: int,
        body: bytes,
        content_type: str = "text/plain; charset=utf-8",
        extra: dict[str, str] | None = None,
        send_body: bool = True,
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s " + format, self.address_string(), *args)
