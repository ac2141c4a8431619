"""The metrics endpoint's ``/debug/`` routes: on-demand profiles of the serving process (:mod:`.captures`).

``start_http_server`` sends every path under ``/debug/`` here; everything else stays the exposition's.

* ``POST /debug/profile?steps=N&seconds=T[&memory=1]``: arm a capture of the next ``N`` forward steps,
  for at most ``T`` seconds (with ``memory=1``, the CUDA allocator's history over them and a snapshot at
  their end); ``202`` and the capture's state as JSON. ``403`` when profiling is off in this process,
  ``409`` while another capture is under way (refused, never queued), ``400`` beyond the configured
  bounds, ``501`` in multiprocess mode (the endpoint's process is not the workers').
* ``GET /debug/profile[?id=ID]``: the state of the latest capture (or of ``ID``).
* ``GET /debug/profile/trace?id=ID``: the compressed Chrome trace of a finished capture.
* ``GET /debug/profile/list``: the captures kept (the latest few), oldest first.
* ``GET /debug/profile/memory?id=ID``: the memory snapshot of a finished ``memory=1`` capture.
* ``POST /debug/oom?seconds=T``: arm for the next OOM for ``T`` seconds (:mod:`.memory_evidence`);
  ``GET /debug/oom``: armed or not, OOMs caught, their files; ``GET /debug/oom/file?n=I&kind=K``: file
  ``K`` (``summary`` or ``snapshot``) of the ``I``-th OOM listed (``-1``: the latest).
* ``POST /debug/alertmanager[?steps=N&seconds=T]``: an Alertmanager webhook receiver. A ``firing``
  notification takes one capture, at most one per alert group (the payload's ``groupKey``) every
  ``INFERWATCH_PROFILE_ALERT_INTERVAL_SECONDS``; ``resolved`` ones and groups inside their interval are
  answered 200 with what was skipped. While another capture is under way the answer is 503, and the
  group's interval is not spent: Alertmanager retries the notification, so the group gets its capture.

Only this module's answers are JSON; no request names a file: a trace is found by the capture's id, which
the process made. A body that cannot be used (not JSON, nested too deep to parse, not a webhook payload,
too large) is answered 400 with one log line, never a 500. Importing this module imports no torch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from inferwatch.common.httpserver import Receive, Scope, Send, respond
from inferwatch.common.lograte import RateLimit
from inferwatch.instrumentation.profiling.captures import CAPTURES, CaptureRefused, ProfileConfig
from inferwatch.instrumentation.profiling.memory_evidence import MEMORY, cuda_ready

PREFIX = "/debug/"
#: The largest webhook body read (Alertmanager's payload of a large group is tens of kilobytes).
MAX_BODY_BYTES = 1 << 20
#: Alert groups whose last capture time is remembered (the least recent are forgotten).
MAX_GROUPS = 256
#: What ``POST /debug/profile`` captures when the request does not say.
DEFAULT_STEPS = 20
DEFAULT_SECONDS = 10.0

App = Callable[[Scope, Receive, Send], Any]
#: A ``/debug/`` answer: status, body, headers.
Answer = tuple[int, bytes, list[tuple[str, str]]]

log = logging.getLogger(__name__)
# One line per refused body, a few a minute: a client sending bad bodies in a loop must not flood the log.
log.addFilter(RateLimit())


def _json(status: int, document: Any) -> tuple[int, bytes, list[tuple[str, str]]]:
    body = json.dumps(document, indent=1).encode() + b"\n"
    return status, body, [("Content-Type", "application/json"), ("Cache-Control", "no-store")]


def _error(status: int, message: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    return _json(status, {"error": message})


def refusal(enabled: bool, multiprocess: bool) -> Answer | None:
    """The answer to every ``/debug/`` request of a process where profiling is off (403) or whose models
    run in other processes (501), or None: it needs nothing of the request, so it is sent before any body
    is read (the endpoint's helper process sends it itself)."""
    if not enabled:
        return _error(403, "profiling is off in this process: start it with INFERWATCH_PROFILE=1")
    if multiprocess:
        return _error(501, "profiling a multiprocess server is not supported: its models run in workers")
    return None


class DebugApp:
    """The ``/debug/`` routes, with the process's :class:`ProfileConfig` (read once, from the environment
    unless given)."""

    def __init__(
        self,
        config: ProfileConfig | None = None,
        multiprocess: bool = False,
        models_elsewhere: Callable[[], str | None] | None = None,
    ) -> None:
        self.config = config if config is not None else ProfileConfig.from_env()
        self.multiprocess = multiprocess
        #: Where the models are when this process has none and other processes of its program do (``inferwatch
        #: run``'s endpoint over transformers serve 5.25's engine process), else None.
        self._models_elsewhere = models_elsewhere
        self._groups: OrderedDict[str, float] = OrderedDict()  # groupKey -> time.monotonic() of its capture

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, body, headers = await self.answer(scope, receive)
        await respond(send, status, headers, body, head=scope["method"] == "HEAD")

    async def answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes, list[tuple[str, str]]]:
        path, method = scope["path"], scope["method"]
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if path == "/debug/alertmanager" and method == "POST":
            return await self._alert(query, receive)
        if path == "/debug/profile/list" and method in ("GET", "HEAD"):
            return self._refusal() or _json(200, [c.to_dict() for c in CAPTURES.history()])
        if path == "/debug/profile":
            if method == "POST":
                return self._start(query)
            if method in ("GET", "HEAD"):
                return self._state(query)
            return _error(405, "GET or POST")
        if path in ("/debug/profile/trace", "/debug/profile/memory") and method in ("GET", "HEAD"):
            return await self._file(query, path.rpartition("/")[2])
        if path == "/debug/oom":
            if method == "POST":
                return self._arm(query)
            return self._refusal() or _json(200, MEMORY.state())
        if path == "/debug/oom/file" and method in ("GET", "HEAD"):
            return await self._oom_file(query)
        return _error(404, f"no such path: {path}")

    def _refusal(self) -> tuple[int, bytes, list[tuple[str, str]]] | None:
        refused = refusal(self.config.enabled, self.multiprocess)
        if refused is None and self._models_elsewhere is not None:
            elsewhere = self._models_elsewhere()
            if elsewhere is not None:
                # Said at once: a capture here would wait out its seconds for a forward that never comes.
                return _error(
                    501,
                    f"this process runs no model: {elsewhere}; profiles are taken only in "
                    "the process that serves the endpoint",
                )
        return refused

    def _start(
        self, query: dict[str, list[str]], requested_by: str = "http"
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        try:
            steps = int(query.get("steps", [DEFAULT_STEPS])[0])
            seconds = float(query.get("seconds", [DEFAULT_SECONDS])[0])
        except ValueError:
            return _error(400, "steps must be an integer and seconds a number")
        if not math.isfinite(seconds):
            return _error(400, "seconds must be finite")
        memory = query.get("memory", ["0"])[0] in ("1", "true", "yes")
        try:
            capture = CAPTURES.request(self.config, steps, seconds, requested_by, memory)
        except CaptureRefused as exc:
            return _error(exc.status, str(exc))
        return _json(202, capture.to_dict())

    async def _alert(
        self, query: dict[str, list[str]], receive: Receive
    ) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        body = await read_body(receive)
        try:
            payload = json.loads(body) if len(body) <= MAX_BODY_BYTES else None
            group, status = str(payload["groupKey"]), str(payload["status"])
        except (ValueError, TypeError, KeyError, RecursionError) as exc:
            # RecursionError: valid JSON nested ~1000 deep (2 KB) is deeper than the parser goes.
            log.warning("POST /debug/alertmanager: a body of %d bytes refused (400): %r", len(body), exc)
            return _error(400, f"not an Alertmanager webhook payload (or over {MAX_BODY_BYTES} bytes)")
        if status != "firing":
            return _json(200, {"skipped": f"status {status}"})
        now = time.monotonic()
        last = self._groups.get(group)
        if last is not None and now - last < self.config.alert_interval_seconds:
            return _json(200, {"skipped": f"group captured {now - last:.0f}s ago"})
        status_code, answer, headers = self._start(query, requested_by=f"alertmanager {group}"[:200])
        if status_code == 409:
            return 503, answer, [*headers, ("Retry-After", "5")]  # Alertmanager retries; the group waits
        if status_code == 202:
            self._groups[group] = now
            self._groups.move_to_end(group)
            while len(self._groups) > MAX_GROUPS:
                self._groups.popitem(last=False)
        return status_code, answer, headers

    def _state(self, query: dict[str, list[str]]) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        capture = CAPTURES.get(query.get("id", [None])[0])
        if capture is None:
            return _error(404, "no such capture")
        return _json(200, capture.to_dict())

    async def _file(self, query: dict[str, list[str]], kind: str) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        capture_id = query.get("id", [None])[0]
        capture = CAPTURES.get(capture_id) if capture_id else None
        path = None if capture is None or capture.state != "done" else getattr(capture, f"{kind}_path")
        if path is None:
            return _error(404, f"no finished capture with that id and a {kind} file")
        return await _send_file(path, "application/gzip" if kind == "trace" else "application/octet-stream")

    def _arm(self, query: dict[str, list[str]]) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        if not cuda_ready():
            return _error(400, "arming for an OOM needs a process that uses CUDA")
        try:
            seconds = float(query.get("seconds", ["600"])[0])
        except ValueError:
            return _error(400, "seconds must be a number")
        if not 0 < seconds <= self.config.oom_arm_max_seconds:
            return _error(400, f"seconds must be within (0, {self.config.oom_arm_max_seconds:g}]")
        config = self.config
        MEMORY.arm(seconds, config.memory_max_entries, Path(config.directory), config.max_files)
        return _json(202, MEMORY.state())

    async def _oom_file(self, query: dict[str, list[str]]) -> tuple[int, bytes, list[tuple[str, str]]]:
        refused = self._refusal()
        if refused is not None:
            return refused
        kind = query.get("kind", ["snapshot"])[0]
        try:
            entry = MEMORY.files[int(query.get("n", ["-1"])[0])]
        except (ValueError, IndexError):
            return _error(404, "no such OOM")
        if kind not in ("summary", "snapshot") or MEMORY.directory is None:
            return _error(404, "kind must be summary or snapshot")
        kinds = {"summary": "text/plain; charset=utf-8", "snapshot": "application/octet-stream"}
        return await _send_file(MEMORY.directory / entry[kind], kinds[kind])


async def _send_file(path: Path, content_type: str) -> tuple[int, bytes, list[tuple[str, str]]]:
    """A file this process wrote (its name never comes from the request), read off the event loop."""
    try:
        body = await asyncio.get_running_loop().run_in_executor(None, path.read_bytes)
    except OSError as exc:
        return _error(410, f"the file is gone: {exc.strerror or exc}")
    disposition = f'attachment; filename="{path.name}"'
    return 200, body, [("Content-Type", content_type), ("Content-Disposition", disposition)]


async def read_body(receive: Receive) -> bytes:
    """The request body, cut one byte past :data:`MAX_BODY_BYTES` (so a longer one reads as too long),
    reading no further than that."""
    chunks, size = [], 0
    while size <= MAX_BODY_BYTES:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)[: MAX_BODY_BYTES + 1]


def with_debug_routes(app: App, debug: DebugApp | None = None) -> App:
    """``app`` with the paths under :data:`PREFIX` answered by ``debug`` (default: a :class:`DebugApp`
    configured from the environment)."""
    debug = debug if debug is not None else DebugApp()

    async def dispatch(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(PREFIX):
            await debug(scope, receive, send)
        else:
            await app(scope, receive, send)

    return dispatch
