"""``inferwatch run -- transformers serve`` under a real third-party load generator, ``guidellm``.

guidellm (the vLLM project's benchmark client) sends streaming chat completions of synthetic prompts and
measures each request itself: time to first token, inter-token latency, end-to-end latency, and the
prompt and output tokens of the server's ``usage`` (:mod:`tests.support.guidellm`). What inferwatch
exports for the same requests must agree: request and token counts exactly, the TTFT mean within 10 % or
30 ms of guidellm's (behind the HTTP edge it ends at the first content sent, as the client gets it), the
E2E mean within 10 % or 50 ms, the inter-token latency within 10 %; each request has its queue time,
its first content and the wait in its socket observed, timed from the kernel's receipt.

Three ways to run the server: sequential (one ``generate`` at a time), ``--continuous-batching``, and
``--api-server-count 2`` (HTTP in two API processes, the model in an engine process: transformers 5.25 on;
skipped where the installed ``transformers serve`` has no such option).
"""

from __future__ import annotations

import pytest

from tests.support.guidellm import GuidellmReport, run_guidellm
from tests.support.transformers_serve import (
    RELATIVE_TOLERANCE,
    Server,
    assert_close,
    delta,
    histogram_mean,
    metrics_after,
)

pytestmark = [pytest.mark.integration, pytest.mark.matrix]

#: Requests per run, and their sizes. guidellm's inter-token latency of a request is (last token - first
#: token) / (tokens - 1), so a late first chunk on the client's side (the client or the server's API
#: process waiting for a core) shortens it: with 63 gaps of ~2.5 ms, 24 ms of such delay was 12 % of the
#: ITL on a loaded 2-core machine. 255 gaps spread it four times thinner, at a few seconds a run.
REQUESTS = 8
PROMPT_TOKENS = 32
MAX_TOKENS = 256
#: Requests guidellm keeps in flight in its concurrent profile.
STREAMS = 4
#: The TTFT mean's bound beside the relative one. The goal is 10 ms (issue 49), which quiet runs meet
#: (tests/benchmarks/serve_ttft.py: within 2.3 ms at 1, 4 and 8 streams). guidellm timestamps an SSE line
#: when its own process gets to parse it: on a 2-core machine shared with the server's three processes a
#: starved client read one run's first content 28 ms late on average while its E2E agreed within 5 ms
#: (docs/benchmarks.md, "TTFT as the client gets it"). 30 ms keeps that run from failing the suite; the
#: 50 ms of the other means would hide the 14-25 ms that TTFT used to be short by.
TTFT_TOLERANCE = 0.030


def check_against_guidellm(server: Server, report: GuidellmReport, before: str, after: str) -> None:
    """The server's counts against what guidellm sent, its latencies against what guidellm measured."""
    sent = report.sent
    # guidellm's report can miss its last request (tests.support.guidellm, GuidellmReport.sent): its size
    # is every other's here (the synthetic prompts have one length; the model never samples EOS).
    lost = sent - len(report.requests)
    assert 0 <= lost <= 1, f"guidellm sent {sent} requests and reported {len(report.requests)}"
    assert {r.output_tokens for r in report.requests} == {MAX_TOKENS}, report.requests
    prompt_sizes = {r.prompt_tokens for r in report.requests}
    assert len(prompt_sizes) == 1, report.requests

    assert delta(before, after, "llm_requests_total", status="ok") == sent, server.logs()
    assert delta(before, after, "llm_prompt_tokens_total") == report.prompt_tokens + lost * min(prompt_sizes)
    assert delta(before, after, "llm_generation_tokens_total") == report.output_tokens + lost * MAX_TOKENS
    assert delta(before, after, "llm_time_to_first_token_seconds_count") == sent
    assert delta(before, after, "llm_e2e_request_latency_seconds_count") == sent
    assert delta(before, after, "llm_request_queue_seconds_count") == sent
    assert delta(before, after, "llm_response_time_to_first_content_seconds_count") == sent
    # Each request was timed from the kernel's receipt of it (uvicorn, TCP): what waited in the socket
    # while the API process's event loop was busy is in the server's TTFT, as it is in guidellm's.
    assert delta(before, after, "llm_http_arrivals_total", source="application") == 0
    # Model requests only: guidellm's other requests (its model list) are not arrivals of a model.
    assert delta(before, after, "llm_http_arrivals_total", source="socket") == sent
    assert delta(before, after, "llm_request_socket_wait_seconds_count") == sent
    # One inter-token observation per gap between a request's tokens.
    assert delta(before, after, "llm_inter_token_latency_seconds_count") == sent * (MAX_TOKENS - 1)

    # The means: the server's over every request, guidellm's over those it reported.
    server_ttft = histogram_mean(before, after, "llm_time_to_first_token_seconds")
    server_e2e = histogram_mean(before, after, "llm_e2e_request_latency_seconds")
    server_itl = histogram_mean(before, after, "llm_inter_token_latency_seconds")
    print(
        f"\ninferwatch: TTFT {server_ttft * 1000:.1f} ms, E2E "
        f"{server_e2e * 1000:.1f} ms, ITL {server_itl * 1000:.3f} ms, queue "
        f"{histogram_mean(before, after, 'llm_request_queue_seconds') * 1000:.1f} ms, first content "
        f"{histogram_mean(before, after, 'llm_response_time_to_first_content_seconds') * 1000:.1f} ms, "
        f"socket wait {histogram_mean(before, after, 'llm_request_socket_wait_seconds') * 1000:.1f} ms"
    )
    assert_close("time to first token", server_ttft, report.mean_ttft, absolute=TTFT_TOLERANCE)
    assert_close("end-to-end latency", server_e2e, report.mean_e2e)
    client_itl = report.mean_itl
    assert abs(server_itl - client_itl) <= RELATIVE_TOLERANCE * client_itl, (
        f"inter-token latency: server mean {server_itl * 1000:.3f} ms, guidellm's {client_itl * 1000:.3f} ms"
    )


@pytest.mark.parametrize(
    ("which", "streams"),
    [
        ("server", 1),
        ("server", STREAMS),
        ("batching_server", 1),
        ("batching_server", STREAMS),
        ("batching_server", 2 * STREAMS),
        ("api_servers_server", STREAMS),
    ],
    ids=[
        "sequential-synchronous",
        "sequential-concurrent",
        "continuous-batching-1",
        "continuous-batching-4",
        "continuous-batching-8",
        "api-server-count-2",
    ],
)
def test_metrics_match_what_guidellm_measured(
    which: str, streams: int, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server: Server = request.getfixturevalue(which)
    before = server.metrics()
    report = run_guidellm(
        server,
        tmp_path_factory.mktemp("guidellm"),
        requests=REQUESTS,
        prompt_tokens=PROMPT_TOKENS,
        max_tokens=MAX_TOKENS,
        streams=streams,
    )
    print(f"\nguidellm ({which}, {streams} stream(s)): {report.summary()}")
    # The harness: guidellm sent every request and each it reported succeeded, before the server's side is
    # read.
    assert report.sent == REQUESTS, report.log[-3000:]
    failed = [r for r in report.requests if not r.success]
    assert not failed, f"guidellm saw failed requests: {failed}\n{report.log[-3000:]}\n{server.logs()}"
    after = metrics_after(server, before, "llm_e2e_request_latency_seconds_count", report.sent)
    check_against_guidellm(server, report, before, after)
