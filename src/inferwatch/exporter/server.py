"""The HTTP endpoint: metrics, health, readiness, and a landing page; TLS, basic auth and extra headers
from the web config, which :meth:`ExporterServer.apply_web_config` replaces while serving (SIGHUP).

It runs on the asyncio loop of the caller (the exporter's main thread) through
:mod:`inferwatch.common.httpserver`: one thread for every connection, with idle, slow-request and
connection limits. Checking a password with bcrypt takes tens of milliseconds, so it runs on a small
pool of its own threads, never on the loop; a flood of wrong passwords waits there (bounded) while
scrapes with remembered credentials go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from inferwatch.common.httpserver import (
    HttpServer,
    Limits,
    Receive,
    Scope,
    Send,
    bind,
    request_headers,
    respond,
)
from inferwatch.common.lograte import RateLimit
from inferwatch.common.negotiation import NotAcceptable
from inferwatch.common.webconfig import BasicAuth, Credentials, WebConfig

from .errors import ListenError
from .exposition import ScrapeRenderer

log = logging.getLogger(__name__)
http_log = logging.getLogger(__name__ + ".http")
http_log.addFilter(RateLimit())

_LANDING = """<!DOCTYPE html>
<html><head><title>inferwatch exporter</title></head>
<body><h1>inferwatch exporter</h1>
<p>GPU (NVML), host and serving-process metrics for LLM inference.</p>
<ul><li><a href="{path}">{path}</a></li><li><a href="/-/healthy">/-/healthy</a></li>
<li><a href="/-/ready">/-/ready</a></li></ul></body></html>
"""
_TEXT = "text/plain; charset=utf-8"
# bcrypt checks running at once, and different credentials being checked at most: beyond, unremembered
# credentials are answered 503 (a flood of wrong passwords must not queue without bound).
_BCRYPT_THREADS = 2
_BCRYPT_QUEUE = 16


class ExporterServer:
    """Binds at construction (so a taken port fails before anything starts), serves from :meth:`start`."""

    def __init__(
        self,
        host: str,
        port: int,
        exposition: ScrapeRenderer,
        ready: threading.Event,
        telemetry_path: str = "/metrics",
        web: WebConfig | None = None,
        limits: Limits | None = None,
    ) -> None:
        """Raises :class:`.errors.ListenError` (an ``OSError``, with the failed bind's ``errno``) when the
        address cannot be used."""
        self.exposition = exposition
        self.ready = ready
        self.telemetry_path = telemetry_path
        self.web = web or WebConfig()
        limits = limits or Limits()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            sock = bind(host, port, limits.backlog)
        except OSError as exc:
            raise ListenError(exc.errno, f"cannot listen on {shown}: {exc.strerror or exc}") from None
        self._http = HttpServer(self._app, sock, http_log, ssl_context=self.web.ssl_context, limits=limits)
        self._bcrypt = ThreadPoolExecutor(_BCRYPT_THREADS, thread_name_prefix="bcrypt")
        # Password checks under way or waiting for a bcrypt thread, by the credentials they check.
        self._checks: dict[Credentials, asyncio.Future[bool]] = {}

    @property
    def port(self) -> int:
        return self._http.port

    async def start(self) -> None:
        await self._http.start()

    async def stop(self) -> None:
        """Stop listening (the port is free at once), finish in-flight responses briefly, close the rest."""
        await self._http.stop()
        self._bcrypt.shutdown(wait=False, cancel_futures=True)

    async def apply_web_config(self, web: WebConfig) -> None:
        """Serve with ``web`` from now on: its users and headers at once, its TLS for new connections;
        credentials remembered for users whose hash did not change stay remembered."""
        if web.auth is not None and self.web.auth is not None:
            web.auth.keep_remembered(self.web.auth)
        self.web = web
        await self._http.replace_ssl_context(web.ssl_context)

    # --- the ASGI application ----------------------------------------------------------------------------

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, body, headers = await self._answer(scope)
        head = scope["method"] == "HEAD"
        await respond(send, status, [*headers, *self.web.headers], body, head=head)

    async def _answer(self, scope: Scope) -> tuple[int, bytes, list[tuple[str, str]]]:
        """Status, body and headers (the web config's come on top) of the answer to a request."""
        if scope["method"] not in ("GET", "HEAD"):
            return 405, b"Method not allowed\n", [("Content-Type", _TEXT), ("Allow", "GET, HEAD")]
        headers = request_headers(scope)
        auth = self.web.auth
        verdict = "ok" if auth is None else await self._authorize(auth, headers.get("authorization"))
        if verdict == "busy":
            return 503, b"Too many password checks at once\n", [("Content-Type", _TEXT), ("Retry-After", "1")]
        if verdict != "ok":
            challenge = ("WWW-Authenticate", 'Basic realm="inferwatch"')
            return 401, b"Unauthorized\n", [("Content-Type", _TEXT), challenge]
        path = urlsplit(scope["path"]).path
        if path == self.telemetry_path:
            try:
                body = self.exposition.render(headers.get("accept"), headers.get("accept-encoding"))
            except NotAcceptable as refused:
                return 406, f"{refused}\n".encode(), [("Content-Type", _TEXT)]
            fields = [("Content-Type", body.content_type), ("Vary", "Accept-Encoding")]
            if body.gzipped:
                fields.append(("Content-Encoding", "gzip"))
            return 200, body.data, fields
        if path == "/-/healthy":
            return 200, b"Healthy\n", [("Content-Type", _TEXT)]
        if path == "/-/ready":
            if self.ready.is_set():
                return 200, b"Ready\n", [("Content-Type", _TEXT)]
            return 503, b"Not ready: no collection has finished yet\n", [("Content-Type", _TEXT)]
        if path == "/":
            page = _LANDING.format(path=self.telemetry_path).encode()
            return 200, page, [("Content-Type", "text/html; charset=utf-8")]
        return 404, b"Not found\n", [("Content-Type", _TEXT)]

    async def _authorize(self, auth: BasicAuth, header: str | None) -> str:
        """``ok``, ``denied``, or ``busy`` when too many unremembered credentials wait for bcrypt."""
        credentials = auth.credentials(header)
        if credentials is None:
            return "denied"
        if auth.remembered(credentials):
            return "ok"
        # Scrapers that all carry the same credentials (50 of them starting at once) share one check.
        check = self._checks.get(credentials)
        if check is None:
            if len(self._checks) >= _BCRYPT_QUEUE:
                http_log.warning("%d password checks waiting: answering 503 to more for now", _BCRYPT_QUEUE)
                return "busy"
            loop = asyncio.get_running_loop()
            check = self._checks[credentials] = loop.run_in_executor(self._bcrypt, auth.verify, credentials)
            check.add_done_callback(lambda _: self._checks.pop(credentials, None))
        # Shielded: a waiter cut off (its connection closed) must not cancel the others' check.
        return "ok" if await asyncio.shield(check) else "denied"
