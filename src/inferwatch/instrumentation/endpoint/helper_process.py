"""The metrics endpoint's HTTP in a helper process of its own, so that no client costs the serving loop.

Inside a serving process, every request the endpoint parses and answers takes the GIL from the model's
Python thread: answering 50 scrapes a second in-process took 3.5-8.6 % of a core from it
(docs/benchmarks.md, "The endpoint's helper process"). :func:`inferwatch.instrumentation.endpoint.server.
start_http_server` therefore starts this module as a child process (``inferwatch-http``), hands it the
listening socket, and keeps one thread of its own that only collects the registry when the helper asks:

* **the helper** (:func:`main`) runs the HTTP layer (:mod:`inferwatch.common.httpserver`: TLS, limits,
  the connection cap), basic auth (bcrypt checks included), the request budget and its quiet-client rule
  (:class:`~.app.EndpointApp`), and every encoding (format, gzip, ``name[]``) of the last
  collection it got, which it uses until the serving process says it would collect again
  (:class:`_RemoteRenderings`); it forwards ``/debug/`` requests;
* **the serving process** (:class:`HelperService`, on the ``inferwatch-http`` thread) collects within the
  renderings' budgets (:class:`~.app.Renderer`, charged with the helper's encodings too) and
  sends each collection packed once, answers the forwarded ``/debug/`` requests, and starts the helper
  again if it dies (the listening socket stays open in between: the kernel queues new connections), or
  if it stops answering: it pings the helper every :data:`PING_INTERVAL` and kills one that has not
  answered for :data:`PING_TIMEOUT` (stopped, deadlocked, a paused cgroup), which a helper that merely
  stays alive would otherwise make every scrape wait out. Each restart is logged once and counted in
  ``inferwatch_endpoint_helper_restarts_total{reason}``, served with the registry.

So the serving process spends, whatever the clients do, one collection and its packing per
:data:`~.app.MAX_AGE`, plus those the renderings' budget allows. The two talk over a socket pair in
frames of a JSON head and a byte body. The helper exits when its control socket closes (the serving
process closed the endpoint or died), when the serving process's PID is no longer its parent's, and on
SIGTERM; it ignores SIGINT, so a Ctrl-C in a terminal reaches the serving process, which closes it. It
imports no torch and no model code: it runs ``python -I`` with the serving process's ``sys.path``, so no
``sitecustomize`` on ``PYTHONPATH`` (``inferwatch run``'s) runs in it, and it imports the same inferwatch
as its parent. Being a process of its own, it gives a flood's memory back (:mod:`inferwatch.common.heap`),
which a model server's process must not be made to do.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any

from prometheus_client.metrics_core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from inferwatch.common.authgate import guarded
from inferwatch.common.frames import PREFIX, frame, pack_families, parse_head, parse_prefix, unpack_families
from inferwatch.common.heap import return_freed_memory, trim_freed_memory
from inferwatch.common.httpserver import (
    HttpServer,
    Receive,
    Scope,
    Send,
    name_os_thread,
    not_inherited_by_forks,
    respond,
)
from inferwatch.common.lograte import RateLimit
from inferwatch.common.webconfig import WebConfig, load_web_config
from inferwatch.instrumentation.endpoint.app import (
    HELPER_CPU_SHARE,
    Collection,
    EndpointApp,
    Renderer,
    Rendering,
)
from inferwatch.instrumentation.endpoint.rendering import Variant
from inferwatch.instrumentation.endpoint.server import THREAD_NAME, WEB_CONFIG_ENV
from inferwatch.instrumentation.profiling.http import Answer, DebugApp, read_body, refusal, with_debug_routes

log = logging.getLogger(__name__)
log.addFilter(RateLimit())

# Seconds the helper gets to start (an interpreter, uvicorn, the web config) before start_http_server
# gives up on it; a loaded 2-core machine took 0.3-0.6 s.
START_TIMEOUT = 30.0
# Seconds between a helper's death and the next start, then between failed starts (the last repeats).
_RESTART_DELAYS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# Seconds the helper gets to finish in-flight answers and exit once its control socket closes.
_EXIT_TIMEOUT = 5.0
# Seconds between the helper's looks at whether the serving process is still its parent.
_PARENT_CHECK = 1.0
#: Seconds between the serving process's pings of its helper.
PING_INTERVAL = 1.0
#: Seconds a helper may go without answering a ping before it is killed and replaced: far above what a
#: loaded helper takes (its loop answers between two requests), below a scrape's usual 10 s timeout.
PING_TIMEOUT = 3.0
#: ``reason`` of ``inferwatch_endpoint_helper_restarts_total``: it exited (killed, crashed, out of
#: memory), or it was killed for not answering pings.
EXITED, UNRESPONSIVE = "exited", "unresponsive"
# The serving process's sys.path, for the helper (``python -I`` ignores PYTHONPATH).
_PATH_ENV = "_INFERWATCH_HTTP_SYS_PATH"


async def _read_frame(reader: asyncio.StreamReader) -> tuple[dict[str, Any], bytes]:
    """The next frame; ``asyncio.IncompleteReadError`` once the other side has closed."""
    head_size, body_size = parse_prefix(await reader.readexactly(PREFIX.size))
    head = parse_head(await reader.readexactly(head_size))
    return head, await reader.readexactly(body_size) if body_size else b""


# --- in the serving process --------------------------------------------------------------------------


class HelperRestarts:
    """``inferwatch_endpoint_helper_restarts_total{reason}``, both reasons from 0, and the registry it is
    served with: a collector of both."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry
        self.counts = {EXITED: 0, UNRESPONSIVE: 0}

    def collect(self) -> Iterator[Metric]:
        yield from self._registry.collect()
        family = CounterMetricFamily(
            "inferwatch_endpoint_helper_restarts",
            "Restarts of the metrics endpoint's helper process: it exited, or did not answer pings.",
            labels=["reason"],
        )
        for reason, count in self.counts.items():
            family.add_metric([reason], count)
        yield family


class HelperService:
    """The serving process's side: starts the helper on ``sock``, renders for it, restarts it when it dies.

    Runs on :class:`~inferwatch.common.httpserver.ServerThread`'s loop (``start``/``stop``/``port``).
    """

    def __init__(self, sock: socket.socket, registry: Collector, debug: DebugApp) -> None:
        self._sock = sock
        self._port: int = sock.getsockname()[1]
        self.restarts = HelperRestarts(registry)
        self._renderer = Renderer(self.restarts)
        self._debug = debug
        self._answered = 0.0  # time.monotonic() of the running helper's last answer to a ping
        self._unresponsive = False  # the running helper was killed for not answering
        self._process: subprocess.Popen[bytes] | None = None
        self._control: asyncio.StreamWriter | None = None  # the running helper's control socket
        self._supervisor: asyncio.Task[None] | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self._stopping = False

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        """Start the helper and wait until it serves; raises ``RuntimeError`` if it does not."""
        channel = await self._spawn()
        self._supervisor = asyncio.get_running_loop().create_task(self._supervise(*channel))

    async def _spawn(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        ours, theirs = socket.socketpair()
        not_inherited_by_forks(ours)  # a forked worker's copy would keep the helper from seeing us die
        try:
            debug = (self._debug.config.enabled, self._debug.multiprocess)
            command, env = _helper_command(self._sock.fileno(), theirs.fileno(), *debug)
            self._process = subprocess.Popen(
                command, env=env, pass_fds=(self._sock.fileno(), theirs.fileno()), stdin=subprocess.DEVNULL
            )
        except OSError:
            ours.close()
            raise
        finally:
            theirs.close()
        if self._renderer.collections == 0:
            # The first collection, made while the helper's interpreter starts (0.3-0.6 s): it does the
            # registry's one-off work (the catalogue's collector formats every series' name once: 0.1 s
            # at 64 models), which the first scrape would otherwise wait for. A scrape that comes within
            # MAX_AGE is answered from it. A collector that fails fails the scrapes, as without it.
            with contextlib.suppress(Exception):
                self._renderer.use(_shipped)
        reader, writer = await asyncio.open_connection(sock=ours)
        self._control = writer
        self._answered, self._unresponsive = time.monotonic(), False
        try:
            head, _ = await asyncio.wait_for(_read_frame(reader), START_TIMEOUT)
            if head.get("op") != "ready":
                raise ConnectionError(f"the helper said {head!r}")
        except (OSError, EOFError, ValueError, asyncio.TimeoutError) as exc:
            await self._end_helper()
            raise RuntimeError(f"the metrics endpoint's helper process did not start: {exc!r}") from exc
        return reader, writer

    async def _supervise(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        delays = iter(_RESTART_DELAYS)
        while True:
            pinging = asyncio.get_running_loop().create_task(self._ping(writer))
            with contextlib.suppress(OSError, EOFError, ValueError):
                while True:
                    head, body = await _read_frame(reader)
                    if head.get("op") == "pong":
                        self._answered = time.monotonic()
                        continue
                    delays = iter(_RESTART_DELAYS)  # it served: a later death starts the delays afresh
                    task = asyncio.get_running_loop().create_task(self._answer(head, body, writer))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
            pinging.cancel()
            if self._stopping:
                return
            reason = UNRESPONSIVE if self._unresponsive else EXITED
            code = await self._end_helper()
            self.restarts.counts[reason] += 1
            while not self._stopping:
                delay = next(delays, _RESTART_DELAYS[-1])
                if reason == UNRESPONSIVE:
                    log.warning(
                        "the metrics endpoint's helper process did not answer for %.0f s: killed it, "
                        "starting another in %.1f s",
                        PING_TIMEOUT,
                        delay,
                    )
                else:
                    log.warning(
                        "the metrics endpoint's helper process exited (status %s): starting it again in "
                        "%.1f s",
                        code,
                        delay,
                    )
                await asyncio.sleep(delay)
                try:
                    reader, writer = await self._spawn()
                    break
                except (OSError, RuntimeError) as exc:
                    reason, code = EXITED, exc

    async def _ping(self, writer: asyncio.StreamWriter) -> None:
        """Ping the helper on ``writer`` every PING_INTERVAL; kill it once it has not answered for
        PING_TIMEOUT (its control socket then closes, and :meth:`_supervise` starts another)."""
        while not writer.is_closing():
            writer.write(frame({"op": "ping"}))
            await asyncio.sleep(PING_INTERVAL)
            if time.monotonic() - self._answered > PING_TIMEOUT and self._process is not None:
                self._unresponsive = True
                self._process.kill()  # SIGKILL: a stopped process ends too
                return

    async def _answer(self, head: dict[str, Any], body: bytes, writer: asyncio.StreamWriter) -> None:
        """Answer one request of the helper on ``writer``, its own control socket (not a helper's started
        since, whose requests reuse the ids)."""
        reply: dict[str, Any] = {"id": head.get("id")}
        out = b""
        try:
            if head["op"] == "collect":
                self._renderer.charge(head["encoded"])
                out, snapshot, collected, _ = self._renderer.use(_shipped)
                reply.update(
                    taken=snapshot.taken,
                    collected=collected,
                    reusable_until=self._renderer.reusable_until(snapshot),
                )
                if snapshot.taken == head.get("taken"):  # the helper holds this one already
                    out = b""
            else:
                status, out, headers = await self._debug.answer(_forwarded_scope(head), _body_of(body))
                reply.update(status=status, headers=headers)
        except Exception as exc:  # a broken collector: that request gets a 500, the endpoint goes on
            log.warning("metrics endpoint: answering %s failed: %r", head.get("op"), exc)
            reply["error"], out = repr(exc), b""
        if not writer.is_closing():
            writer.write(frame(reply, out))

    async def _end_helper(self) -> int | None:
        """Close the control socket and wait for the helper to exit (killed if it does not); its status."""
        if self._control is not None:
            self._control.close()
            self._control = None
        process, self._process = self._process, None
        if process is None:
            return None
        try:
            return await asyncio.to_thread(process.wait, _EXIT_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            return await asyncio.to_thread(process.wait)

    async def stop(self) -> None:
        self._stopping = True
        await self._end_helper()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        for task in list(self._answering):
            task.cancel()
        self._sock.close()


def _helper_command(
    listen_fd: int, control_fd: int, profiling: bool, multiprocess: bool
) -> tuple[list[str], dict[str, str]]:
    """``python -I`` running :func:`main`, and its environment: this process's, with this process's
    ``sys.path`` for the helper to import from. ``-I`` ignores ``PYTHONPATH``, so ``inferwatch run``'s
    ``sitecustomize`` (imported at start-up only, before the path below is set) never instruments the
    helper."""
    path = list(sys.path)
    code = (
        f"import json, os, sys; sys.path[:] = json.loads(os.environ.pop({_PATH_ENV!r})); "
        "from inferwatch.instrumentation.endpoint.helper_process import main; sys.exit(main(sys.argv[1:]))"
    )
    fds = (listen_fd, control_fd, os.getpid(), int(profiling), int(multiprocess))
    command = [sys.executable, "-I", "-c", code, *map(str, fds)]
    return command, {**os.environ, _PATH_ENV: json.dumps(path)}


def _shipped(snapshot: Collection) -> bytes:
    """The collection as the helper gets it (:func:`~inferwatch.common.frames.pack_families`): the helper
    encodes every variant from it."""
    if snapshot.shipped is None:
        snapshot.shipped = pack_families(snapshot.families, lines=True)
    return snapshot.shipped


def _forwarded_scope(head: dict[str, Any]) -> Scope:
    return {
        "type": "http",
        "method": head["method"],
        "path": head["path"],
        "query_string": head["query"].encode("latin-1"),
        "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in head["headers"]],
    }


def _body_of(body: bytes) -> Receive:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


# --- in the helper process ---------------------------------------------------------------------------


class _Channel:
    """Requests to the serving process over the control socket, and their answers, matched by id."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._next = 0
        self._waiting: dict[int, asyncio.Future[tuple[dict[str, Any], bytes]]] = {}

    def send(self, head: dict[str, Any], body: bytes = b"") -> None:
        self._writer.write(frame(head, body))

    async def ask(self, head: dict[str, Any], body: bytes = b"") -> tuple[dict[str, Any], bytes]:
        ident, self._next = self._next, self._next + 1
        answer = self._waiting[ident] = asyncio.get_running_loop().create_future()
        try:
            self.send({**head, "id": ident}, body)
            reply, out = await answer
        finally:
            self._waiting.pop(ident, None)
        if "error" in reply:
            raise RuntimeError(f"the serving process could not answer: {reply['error']}")
        return reply, out

    async def run(self) -> None:
        """Hand answers to their askers until the serving process closes the socket."""
        try:
            while True:
                head, body = await _read_frame(self._reader)
                if head.get("op") == "ping":  # the serving process checks that this loop still runs
                    self.send({"op": "pong"})
                    continue
                answer = self._waiting.get(head.get("id"))
                if answer is not None and not answer.done():
                    answer.set_result((head, body))
        except (OSError, EOFError, ValueError):
            pass

    def close(self) -> None:
        """Fail what still waits for an answer (once the server has cut its requests), and close."""
        for answer in self._waiting.values():
            if not answer.done():
                answer.set_exception(ConnectionError("the serving process closed the endpoint"))
        self._writer.close()


class _RemoteRenderings:
    """Answers encoded here from the serving process's collections: the last one is used until the serving
    process would collect again (``reusable_until``); requests that need a new one while it is being asked
    for wait for that one."""

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._snapshot: Collection | None = None
        self._reusable_until = 0.0
        self._asking: asyncio.Future[bool] | None = None
        self._encoded = 0.0  # CPU seconds spent encoding since the last ask, charged to the renderings

    async def rendering(self, variant: Variant) -> Rendering:
        collected = False
        if self._snapshot is None or time.monotonic() >= self._reusable_until:
            asking = self._asking
            if asking is None:
                asking = self._asking = asyncio.ensure_future(self._ask())
                asking.add_done_callback(self._asked)
                collected = await asyncio.shield(asking)
            else:
                await asyncio.shield(asking)
        snapshot = self._snapshot
        assert snapshot is not None  # set by the ask, which raises otherwise
        started = time.thread_time()
        answer = snapshot.answer(variant)
        cpu = time.thread_time() - started
        self._encoded += cpu
        return Rendering(answer, snapshot.taken, collected, cpu)

    def _asked(self, asked: asyncio.Future[bool]) -> None:
        self._asking = None
        if not asked.cancelled():
            asked.exception()  # retrieved: the requests that waited for it may all have been cut

    async def _ask(self) -> bool:
        """A collection from the serving process (the last one again, if it would not collect now);
        whether it was collected for this ask."""
        held = self._snapshot.taken if self._snapshot is not None else None
        encoded, self._encoded = self._encoded, 0.0
        head, body = await self._channel.ask({"op": "collect", "taken": held, "encoded": encoded})
        if self._snapshot is None or head["taken"] != held:
            self._snapshot = Collection(unpack_families(body, trusted=True), head["taken"])
        self._reusable_until = head["reusable_until"]
        return bool(head["collected"])


def _forward_debug(channel: _Channel, refused: Answer | None) -> Any:
    """An ASGI app that answers ``/debug/`` requests with the serving process's :class:`DebugApp`, or,
    where that refuses them all (``refused``), at once, before any body is read."""

    async def forward(scope: Scope, receive: Receive, send: Send) -> None:
        if refused is not None:
            status, out, fields = refused
            await respond(send, status, fields, out, head=scope["method"] == "HEAD")
            return
        # A body over the bound arrives one byte too long: the serving process refuses it as too large.
        body = await read_body(receive)
        headers = [(name.decode("latin-1"), value.decode("latin-1")) for name, value in scope["headers"]]
        head = {
            "op": "debug",
            "method": scope["method"],
            "path": scope["path"],
            "query": scope.get("query_string", b"").decode("latin-1"),
            "headers": headers,
        }
        reply, out = await channel.ask(head, body)
        fields = [(name, value) for name, value in reply["headers"]]
        await respond(send, reply["status"], fields, out, head=scope["method"] == "HEAD")

    return forward


async def _serve(
    listener: socket.socket, control: socket.socket, web: WebConfig, parent: int, debug: Answer | None
) -> None:
    reader, writer = await asyncio.open_connection(sock=control)
    channel = _Channel(reader, writer)
    app = EndpointApp(_RemoteRenderings(channel), share=HELPER_CPU_SHARE, whole_thread=True)
    server = HttpServer(
        guarded(with_debug_routes(app, _forward_debug(channel, debug)), web),
        listener,
        log,
        ssl_context=web.ssl_context,
    )
    await server.start()
    channel.send({"op": "ready"})
    loop = asyncio.get_running_loop()
    ended = loop.create_task(channel.run())
    trimming = loop.create_task(trim_freed_memory())  # held: the loop keeps only a weak reference
    loop.add_signal_handler(signal.SIGTERM, ended.cancel)
    try:
        while not ended.done():
            await asyncio.wait([ended], timeout=_PARENT_CHECK)
            if os.getppid() != parent:  # the serving process died and something else adopted us
                break
    finally:
        ended.cancel()
        trimming.cancel()
        await server.stop()  # before the waiting requests fail: stopping cuts them without a word
        channel.close()


def main(argv: Sequence[str]) -> int:
    """The helper: ``LISTEN_FD CONTROL_FD PARENT_PID PROFILING MULTIPROCESS`` (what :class:`HelperService`
    passes; the last two, 1 or 0, say whether ``/debug/`` requests are refused before their body)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the serving process's to handle
    name_os_thread(THREAD_NAME)
    return_freed_memory()  # a process of its own, unlike the serving process: its floods leave no peak
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s inferwatch-http[%(process)d]: %(message)s")
    listen_fd, control_fd, parent, profiling, multiprocess = (int(arg) for arg in argv)
    listener = socket.socket(fileno=listen_fd)
    control = socket.socket(fileno=control_fd)
    # The serving process checked this file before starting the helper; a change in between is refused
    # here, which the serving process sees as a helper that did not start.
    web = load_web_config(os.environ.get(WEB_CONFIG_ENV, ""))
    asyncio.run(_serve(listener, control, web, parent, refusal(bool(profiling), bool(multiprocess))))
    return 0
