"""The middleware's response watch on its own: which bytes carry content, when a client's leaving
cancels its request, and that nothing the watch does can break the application.

The servers and clients are in tests/integration/serving/test_http_edge.py; here the ASGI channels are
driven by hand, message by message, as a server would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware
from inferwatch.instrumentation.edge.response import ResponseWatch
from inferwatch.instrumentation.metrics.catalogue import metrics_for
from inferwatch.instrumentation.timing.arrival import ARRIVAL, Arrival
from tests.support import sample_value


def event(payload: object) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


ROLE = event({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
CONTENT = event({"choices": [{"index": 0, "delta": {"content": "Hi"}}]})


@pytest.mark.parametrize(
    ("content_type", "chunks", "first"),
    [
        ("text/event-stream", [ROLE, CONTENT], 1),  # the role chunk is no content
        ("text/event-stream; charset=utf-8", [ROLE[:10], ROLE[10:] + CONTENT[:7], CONTENT[7:]], 2),  # split
        ("text/event-stream", [event({"type": "response.output_text.delta", "delta": "Hi"})], 0),
        ("text/event-stream", [event({"choices": [{"index": 0, "text": "Hi"}]})], 0),  # completions
        ("text/event-stream", [b"data: [DONE]\n\n"], None),
        ("text/event-stream", [b"data: plain words\n\n"], 0),
        ("application/json", [b'{"choices": []}'], 0),  # any other body: its first byte
        ("text/plain", [b"", b"tokens"], 1),
    ],
)
def test_the_first_content_chunk(content_type: str, chunks: list[bytes], first: int | None) -> None:
    watch = ResponseWatch(Arrival(at=0.0))
    watch.started(200, content_type)
    for index, chunk in enumerate(chunks):
        watch.sent(chunk, True, float(index + 1))
    assert watch.first_content == (None if first is None else float(first + 1))


class Cancelled:
    def __init__(self) -> None:
        self.at: list[float] = []

    def __call__(self, at: float, undelivered_from: float) -> None:
        self.at.append(at)


def serve(app: Any, *, leave_before_end: bool, registry: CollectorRegistry) -> None:
    """One request through ArrivalMiddleware: its body, then ``http.disconnect`` either while the app is
    still streaming (the client left) or once its response is complete (as uvicorn answers then)."""
    done = asyncio.Event()
    left = asyncio.Event()

    async def receive() -> dict:
        if not receive.delivered:  # type: ignore[attr-defined]
            receive.delivered = True  # type: ignore[attr-defined]
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await (left.wait() if leave_before_end else done.wait())
        return {"type": "http.disconnect"}

    receive.delivered = False  # type: ignore[attr-defined]

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    async def client_leaves() -> None:
        await asyncio.sleep(0.01)
        left.set()

    async def run() -> None:
        leaving = asyncio.ensure_future(client_leaves())
        scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
        await ArrivalMiddleware(app, registry=registry)(scope, receive, send)
        await leaving

    asyncio.run(run())


def streaming_app(cancelled: Cancelled, status: object = 200) -> Any:
    async def app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        ARRIVAL.get().claim(None, cancelled)
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]}
        )
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.sleep(0.05)  # the client leaves here, when it does
        await send({"type": "http.response.body", "body": b"last", "more_body": False})

    return app


def test_a_client_that_leaves_mid_response_cancels_its_request_once() -> None:
    cancelled = Cancelled()
    serve(streaming_app(cancelled), leave_before_end=True, registry=CollectorRegistry())
    assert len(cancelled.at) == 1


def test_the_disconnect_after_a_complete_response_cancels_nothing() -> None:
    cancelled = Cancelled()
    serve(streaming_app(cancelled), leave_before_end=False, registry=CollectorRegistry())
    assert cancelled.at == []


def test_a_failing_watch_is_counted_and_the_response_goes_through() -> None:
    registry = CollectorRegistry()
    metrics_for(registry, InstrumentConfig())
    cancelled = Cancelled()
    # A status the watch cannot read: the application's response must still reach the server.
    serve(streaming_app(cancelled, status="two hundred"), leave_before_end=False, registry=registry)
    text = generate_latest(registry).decode()
    assert sample_value(text, "llm_instrumentation_errors_total", stage="middleware") == 1
