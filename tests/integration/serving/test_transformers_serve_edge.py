"""``transformers serve`` under ``inferwatch run``, at its HTTP edge: what the server sent, finish reasons,
clients that hang up, requests it refused, zero tokens asked for; sequential, continuous batching and
(transformers 5.25 on) `--api-server-count 2`.

The launcher adds ``ArrivalMiddleware`` to transformers serve's FastAPI app. Each figure is compared with
what the official ``openai`` client measured or was told in the same run: its time to first content, its
``finish_reason`` per request, the HTTP status it got.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from inferwatch.instrumentation.endpoint.app import AGE_HEADER
from tests.support import parse_samples
from tests.support.services import wait_until
from tests.support.transformers_serve import Completion, Server, assert_close, delta, stream_chat, value

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

CLIENTS = 4
MAX_TOKENS = 24
FINISHED = "llm_requests_finished_total"
FIRST_CONTENT = "llm_response_time_to_first_content_seconds"
LAST_BYTE = "llm_response_time_to_last_byte_seconds"
SERVERS = ["server", "batching_server", "api_servers_server"]


def settled(server: Server, condition: object, timeout: float = 60) -> str:
    """The exposition once ``condition(text)`` holds (some observations follow the response)."""

    def probe() -> str | None:
        text = server.metrics()
        return text if condition(text) else None  # type: ignore[operator]

    return wait_until(probe, timeout=timeout, what=lambda: f"the metrics to settle\n{server.logs()}")


@pytest.mark.parametrize("which", SERVERS)
def test_first_content_and_finish_reasons_match_the_clients(
    which: str, request: pytest.FixtureRequest
) -> None:
    server: Server = request.getfixturevalue(which)
    client = server.client()
    sequential = which == "server"
    # A stop string the model will produce (greedy: the same answer to the same prompt). Continuous
    # batching takes one generation config for every request, so only the sequential server gets one.
    stop = None
    if sequential:
        start = server.metrics()
        probe = stream_chat(client, server.model, "stop here", MAX_TOKENS)
        assert probe.finish_reason == "length", probe
        stop = probe.content[MAX_TOKENS // 2]
        # The probe's own finish reason is counted with its other observations, once its count is read.
        settled(server, lambda text: delta(start, text, FINISHED, finish_reason="length") >= 1)
    before = server.metrics()
    barrier = threading.Barrier(CLIENTS)

    def one(index: int) -> Completion:
        barrier.wait(timeout=30)
        if stop is not None and index % 2:
            return stream_chat(client, server.model, "stop here", MAX_TOKENS, stop=[stop])
        return stream_chat(client, server.model, f"request {index}: the weather", MAX_TOKENS)

    with ThreadPoolExecutor(CLIENTS) as pool:
        chats = list(pool.map(one, range(CLIENTS)))
    after = settled(
        server,
        lambda text: (
            sum(delta(before, text, FINISHED, finish_reason=r) for r in ("stop", "length")) >= CLIENTS
            and delta(before, text, f"{LAST_BYTE}_count") >= CLIENTS
        ),
    )

    told = {reason: sum(c.finish_reason == reason for c in chats) for reason in ("stop", "length")}
    if sequential:
        assert told["stop"] == told["length"] == CLIENTS // 2, told  # both reasons exercised
    counted = {reason: delta(before, after, FINISHED, finish_reason=reason) for reason in told}
    assert counted == told, server.logs()

    assert delta(before, after, f"{FIRST_CONTENT}_count") == CLIENTS
    first = delta(before, after, f"{FIRST_CONTENT}_sum") / CLIENTS
    last = delta(before, after, f"{LAST_BYTE}_sum") / CLIENTS
    clients_first = sum(c.time_to_first_chunk for c in chats) / CLIENTS
    clients_total = sum(c.total for c in chats) / CLIENTS
    print(
        f"\n{which}: first content {first * 1e3:.1f} / clients {clients_first * 1e3:.1f} ms;"
        f" last byte {last * 1e3:.1f} / clients {clients_total * 1e3:.1f} ms"
    )
    assert_close("time to first content", first, clients_first)
    assert_close("time to the last byte", last, clients_total)


def last_collection_without(server: Server, condition: object, timeout: float = 30) -> tuple[float, str]:
    """Scrape until ``condition(text)`` holds; return when the last collection that did not show it was
    made (``time.perf_counter()``, or -inf if none), and the first text that did.

    A collection is made at the answer's arrival less the age the answer states: under several scrapes a
    second the endpoint answers from one collection up to 0.75 s old (docs/serving.md, "Answers at most
    0.75 s old"), so when an answer first shows an event says more about that cache than about the event.
    The event happened after the last collection that did not show it."""
    missed = [float("-inf")]

    def probe() -> str | None:
        answer = requests.get(server.metrics_url, timeout=10)
        assert answer.status_code == 200, answer.status_code
        made = time.perf_counter() - float(answer.headers.get(AGE_HEADER, 0.0))
        if condition(answer.text):  # type: ignore[operator]
            return answer.text
        missed[0] = max(missed[0], made)
        return None

    text = wait_until(probe, timeout=timeout, what=lambda: f"the metrics to settle\n{server.logs()}")
    return missed[0], text


@pytest.mark.parametrize("which", SERVERS)
def test_a_client_that_hangs_up_is_cancelled_at_once(which: str, request: pytest.FixtureRequest) -> None:
    # The middleware sees the client go and ends its request then. transformers serve itself stops the
    # generation: the sequential server's streamer raises _GenerationCancelled from its next put(), and
    # continuous batching gets cancel_request(request_id). Either way the client's doing, not an error.
    server: Server = request.getfixturevalue(which)
    before = server.metrics()
    stream = server.client().chat.completions.create(
        model=server.model,
        messages=[{"role": "user", "content": "a long story, please"}],
        max_tokens=2000,  # seconds of decoding on a CPU: far beyond the hang-up
        stream=True,
    )
    contents = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            contents += 1
            if contents == 3:
                break
    stream.close()
    left = time.perf_counter()
    missed, _ = last_collection_without(
        server,
        lambda text: (
            delta(before, text, "llm_requests_total", status="cancelled") >= 1
            and value(text, "llm_requests_running") == 0
        ),
    )
    # Its tokens are counted as the request's observations are resolved, just after its end is counted:
    # at least the three the client read.
    after = settled(server, lambda text: delta(before, text, "llm_generation_tokens_total") >= 3)
    statuses = {s: delta(before, after, "llm_requests_total", status=s) for s in ("ok", "cancelled", "error")}
    assert statuses == {"ok": 0, "cancelled": 1, "error": 0}, server.logs()
    assert missed - left < 1.0, (
        f"a collection {missed - left:.2f} s after the client left still had it running"
    )
    # transformers serve stops generating for a client that left (at its next token, or step): what it
    # generated after the disconnect is wasted, no more than it generated in all less what was read.
    generated = delta(before, after, "llm_generation_tokens_total")
    wasted = delta(before, after, "llm_wasted_tokens_total")
    changed = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        - value(before, sample.name, **sample.labels)
        for sample in parse_samples(after)
        if sample.name.startswith("llm_") and sample.value != value(before, sample.name, **sample.labels)
    }
    assert 0 <= wasted <= generated - 3, (wasted, generated, changed)


@pytest.mark.parametrize("which", SERVERS)
def test_refused_requests_and_zero_tokens_are_counted(which: str, request: pytest.FixtureRequest) -> None:
    server: Server = request.getfixturevalue(which)
    api = f"http://127.0.0.1:{server.api_port}/v1"
    before = server.metrics()
    ask = {"model": server.model, "messages": [{"role": "user", "content": "hello"}]}
    answers = {
        # transformers serve's own 400: a completion's prompt must be a string.
        "prompt not a string": requests.post(
            f"{api}/completions", json={"model": server.model, "prompt": 7}, timeout=60
        ).status_code,
        "empty messages": requests.post(
            f"{api}/chat/completions", json={**ask, "messages": []}, timeout=60
        ).status_code,
        # Sequential: generate raises (a 500); continuous batching: an empty answer (a 200).
        "max_tokens=0": requests.post(
            f"{api}/chat/completions", json={**ask, "max_tokens": 0}, timeout=60
        ).status_code,
    }
    print(f"\n{which}: {answers}")
    # What transformers answers changed across releases (5.24: a 500 for empty messages and, sequential,
    # for max_tokens=0; 5.25: 400s): each refusal is counted as the client saw it, 4xx rejected and 5xx
    # server_error, and max_tokens=0 is a client mistake (rejected) whatever the server answered.
    assert answers["prompt not a string"] == 400, answers
    refused = [answers["prompt not a string"], answers["empty messages"]]
    assert all(status >= 400 for status in refused), answers
    rejected = sum(1 for status in refused if status < 500) + 1
    after = settled(
        server, lambda text: delta(before, text, "llm_requests_total", status="rejected") >= rejected
    )
    changed = {
        s: delta(before, after, "llm_requests_total", status=s)
        for s in ("ok", "error", "cancelled", "rejected", "server_error")
    }
    expected = {"ok": 0, "error": 0, "cancelled": 0, "rejected": rejected, "server_error": 3 - rejected}
    assert changed == expected, (answers, server.logs())
