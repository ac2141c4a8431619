"""What ``ArrivalMiddleware`` costs the event loop per request: an OpenAI-style streamed response of
``--chunks`` server-sent events through the bare application, through a pass-through ASGI middleware (the
floor any middleware pays: one more call and two wrapped channels), and through inferwatch's, driven in
process as a server drives an application (the body, then ``http.disconnect`` once the response is
complete, as uvicorn answers a ``receive`` after it), its ``receive`` bound to a cycle that leads to a real
TCP connection on loopback as uvicorn's does (inferwatch's reads when its data came in). The application
claims the request's arrival for a model's series, as ``generate`` would, so the middleware does everything
it does in a server: watch the response, find the first content, observe the response histograms.

Each figure is the best of ``--repeat`` interleaved rounds of ``--requests`` requests, in µs per request.
Run it with an earlier tree first on ``PYTHONPATH`` to compare versions (its middleware is what
``inferwatch.instrumentation.edge.middleware`` resolves to)::

    python tests/benchmarks/middleware_cost.py [--requests 2000] [--chunks 64] [--repeat 7]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry

from inferwatch.instrumentation.config import InstrumentConfig
from inferwatch.instrumentation.edge.middleware import ArrivalMiddleware
from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.model_series import series_for
from inferwatch.instrumentation.timing.arrival import ARRIVAL

SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}


def streaming_app(chunks: int, series: Any) -> Callable[..., Any]:
    role = f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'role': 'assistant'}}]})}\n\n".encode()
    content = f"data: {json.dumps({'choices': [{'index': 0, 'delta': {'content': 'tok'}}]})}\n\n".encode()

    async def app(scope: dict, receive: Any, send: Any) -> None:
        await receive()
        arrival = ARRIVAL.get()
        if arrival is not None:
            try:
                arrival.claim(series, lambda at: None)
            except TypeError:  # a tree before the HTTP edge: claim() took no arguments
                arrival.claim()
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": role, "more_body": True})
        for _ in range(chunks):
            await send({"type": "http.response.body", "body": content, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})

    return app


def pass_through(app: Callable[..., Any]) -> Callable[..., Any]:
    async def middleware(scope: dict, receive: Any, send: Any) -> None:
        async def receive_wrapper() -> Any:
            return await receive()

        async def send_wrapper(message: Any) -> None:
            await send(message)

        await app(scope, receive_wrapper, send_wrapper)

    return middleware


class Cycle:
    """One request as uvicorn hands it over: ``receive`` bound to a cycle that holds the connection's
    transport (a real TCP connection on loopback, so the middleware reads when its data came in), the
    body, then a disconnect once the response is done."""

    def __init__(self, connection: socket.socket) -> None:
        self.transport = self  # uvicorn's cycle.transport.get_extra_info("socket")
        self._connection = connection
        self._complete = asyncio.Event()
        self._delivered = False

    def get_extra_info(self, name: str) -> Any:
        return self._connection if name == "socket" else None

    async def receive(self) -> dict:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self._complete.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._complete.set()


async def round_of(app: Callable[..., Any], requests: int, connection: socket.socket) -> float:
    start = time.perf_counter()
    for _ in range(requests):
        cycle = Cycle(connection)
        await app(dict(SCOPE), cycle.receive, cycle.send)
    return (time.perf_counter() - start) / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    registry = CollectorRegistry()
    series = series_for(cat.metrics_for(registry, InstrumentConfig()), "bench")
    app = streaming_app(args.chunks, series)
    kwargs = {"registry": registry}
    try:
        inferwatch = ArrivalMiddleware(app, **kwargs)
    except TypeError:  # a tree before the HTTP edge: no options
        inferwatch = ArrivalMiddleware(app)
    variants = {
        "bare application": app,
        "pass-through middleware": pass_through(app),
        "ArrivalMiddleware": inferwatch,
    }
    best = dict.fromkeys(variants, float("inf"))

    async def run(connection: socket.socket) -> None:
        for _ in range(args.repeat):
            for name, variant in variants.items():
                best[name] = min(best[name], await round_of(variant, args.requests, connection))

    with socket.create_server(("127.0.0.1", 0)) as listener:
        client = socket.create_connection(listener.getsockname())
        served, _ = listener.accept()
        with client, served:
            client.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n\r\n{}")
            asyncio.run(run(served))
    bare = best["bare application"]
    print(f"{args.chunks} event chunks per response, best of {args.repeat} x {args.requests} requests")
    print("| variant | µs per request | over the bare application |")
    print("|---|---|---|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1e6:.1f} | {(seconds - bare) * 1e6:+.1f} |")


if __name__ == "__main__":
    main()
