"""The endpoint's helper process: what it imports, what it answers from, and that it never outlives the
serving process that started it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request

import psutil
import pytest
from prometheus_client import CollectorRegistry, Counter

from inferwatch.instrumentation.endpoint import helper_process
from inferwatch.instrumentation.endpoint.helper_process import PING_INTERVAL, PING_TIMEOUT
from inferwatch.instrumentation.endpoint.server import THREAD_NAME, start_http_server
from inferwatch.instrumentation.profiling.http import MAX_BODY_BYTES
from tests.support import http_get, sample_value
from tests.support.services import wait_until

# A serving process in miniature: an endpoint on a free port, its port printed, then nothing but waiting.
_SERVING = textwrap.dedent(
    """
    import sys, time
    import torch  # the serving process has it loaded; its helper must not
    from prometheus_client import Counter
    from inferwatch.instrumentation.endpoint.server import start_http_server
    Counter("llm_child_events", "Events of the serving process.").inc(7)
    server = start_http_server(0)
    print(server.port, flush=True)
    time.sleep(600)
    """
)


def _helper(parent: psutil.Process) -> psutil.Process:
    def found() -> psutil.Process | None:
        helpers = [child for child in parent.children() if child.name() == THREAD_NAME]
        return helpers[0] if helpers else None

    return wait_until(found, timeout=30, what="the endpoint's helper process")


@pytest.mark.parametrize("death", ["SIGKILL", "SIGTERM"])
def test_the_helper_ends_with_the_serving_process(death: str) -> None:
    serving = subprocess.Popen([sys.executable, "-c", _SERVING], stdout=subprocess.PIPE, text=True)
    try:
        port = int(serving.stdout.readline())  # type: ignore[union-attr]
        _, body = http_get(f"http://127.0.0.1:{port}/metrics")
        assert sample_value(body, "llm_child_events_total") == 7
        helper = _helper(psutil.Process(serving.pid))
        # It imports neither torch nor the serving process's code, whatever the serving process did.
        assert not any("torch" in os.path.basename(m.path) for m in helper.memory_maps())
        serving.send_signal(getattr(signal, death))
        serving.wait(10)
        helper.wait(10)  # psutil.TimeoutExpired if it outlived the serving process
    finally:
        serving.kill()
        serving.wait()
    with pytest.raises(OSError):
        http_get(f"http://127.0.0.1:{port}/metrics", timeout=1)


def test_the_helper_ignores_a_terminals_ctrl_c() -> None:
    registry = CollectorRegistry()
    Counter("llm_ctrl_c_events", "Events.", registry=registry).inc()
    with start_http_server(0, registry=registry) as server:
        helper = _helper(psutil.Process())
        helper.send_signal(signal.SIGINT)  # what a Ctrl-C sends the whole foreground process group
        assert sample_value(http_get(server.url)[1], "llm_ctrl_c_events_total") == 1
        assert helper.is_running() and helper.status() != psutil.STATUS_ZOMBIE


def test_a_forwarded_debug_body_over_the_bound_is_refused_as_too_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFERWATCH_PROFILE", "1")
    with start_http_server(0, registry=CollectorRegistry()) as server:
        url = server.url.replace("/metrics", "/debug/alertmanager")
        # A webhook payload padded past the bound, which the helper forwards one byte too long.
        padded = b'{"groupKey": "g", "status": "resolved", "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
        for body, status in ((padded, 400), (b'{"groupKey": "g", "status": "resolved"}', 200)):
            request = urllib.request.Request(url, data=body, method="POST")
            try:
                with urllib.request.urlopen(request, timeout=10) as answer:
                    got, text = answer.status, answer.read().decode()
            except urllib.error.HTTPError as exc:
                got, text = exc.code, exc.read().decode()
            assert got == status, text
            if status == 400:
                assert f"over {MAX_BODY_BYTES} bytes" in text


def _post(url: str, body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(url, data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize("helper", ["1", "0"])
def test_a_webhook_body_nested_too_deep_is_a_400_with_one_log_line(
    helper: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("INFERWATCH_PROFILE", "1")
    monkeypatch.setenv("INFERWATCH_HTTP_PROCESS", helper)
    with start_http_server(0, registry=CollectorRegistry()) as server:
        url = server.url.replace("/metrics", "/debug/alertmanager")
        # Valid JSON, 2 KB, deeper than the parser goes (RecursionError); then nested in a valid payload.
        deep = b"[" * 990 + b"]" * 990
        for body in (deep, b'{"groupKey": ' + deep + b', "status": "firing"}'):
            caplog.clear()
            status, text = _post(url, body)
            assert status == 400, text
            assert "not an Alertmanager webhook payload" in text
            refused = [r for r in caplog.records if "refused (400)" in r.getMessage()]
            assert len(refused) == 1 and refused[0].exc_info is None, caplog.text
            assert "Traceback" not in caplog.text
        assert _post(url, b'{"groupKey": "g", "status": "resolved"}')[0] == 200


@pytest.mark.parametrize("helper", ["1", "0"])
def test_a_debug_request_is_refused_before_its_body_when_profiling_is_off(
    helper: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("INFERWATCH_PROFILE", raising=False)
    monkeypatch.setenv("INFERWATCH_HTTP_PROCESS", helper)
    with start_http_server(0, registry=CollectorRegistry()) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
            # A head that promises a body which never comes.
            client.sendall(b"POST /debug/alertmanager HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            started = time.monotonic()
            answer = b""
            while b"profiling is off" not in answer and (chunk := client.recv(4096)):
                answer += chunk
            waited = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 403"), answer
        assert b"profiling is off" in answer
        assert waited < 2.0  # not the 10 s the request's deadline allows for its body


def test_a_stopped_helper_is_killed_and_replaced_and_the_restart_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = CollectorRegistry()
    Counter("llm_wedged_events", "Events.", registry=registry).inc()
    with start_http_server(0, registry=registry) as server:
        body = http_get(server.url)[1]
        assert sample_value(body, "inferwatch_endpoint_helper_restarts_total", reason="unresponsive") == 0
        assert sample_value(body, "inferwatch_endpoint_helper_restarts_total", reason="exited") == 0
        stopped = _helper(psutil.Process())
        stopped.send_signal(signal.SIGSTOP)  # alive, its socket open, answering nothing: what a deadlock does
        started = time.monotonic()

        def replaced() -> psutil.Process | None:
            helper = _helper(psutil.Process())
            return helper if helper.pid != stopped.pid else None

        helper = wait_until(replaced, timeout=PING_TIMEOUT + PING_INTERVAL + 10, what="a new helper")
        body = http_get(server.url, timeout=10)[1]
        waited = time.monotonic() - started
        assert waited < PING_TIMEOUT + PING_INTERVAL + 3, waited
        assert sample_value(body, "llm_wedged_events_total") == 1
        assert sample_value(body, "inferwatch_endpoint_helper_restarts_total", reason="unresponsive") == 1
        assert sample_value(body, "inferwatch_endpoint_helper_restarts_total", reason="exited") == 0
        assert not psutil.pid_exists(stopped.pid)  # killed and reaped, no zombie
        assert helper.is_running()
    lines = [r for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(lines) == 1, caplog.text


@pytest.mark.timing  # a latency bound: in the timing tier, not the unit tier's
def test_the_first_scrape_after_a_quiet_spell_is_not_held_back_by_the_helpers_idle_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The helper's CPU budget counts all of its loop's CPU, and an idle helper still works (it answers
    pings, checks its parent, trims its heap): ~4 ms a second, which the budget charged to the first
    scrape after the spell, paid back only at the budget's share (under ``transformers serve``: 1.2 s
    after 70 s idle, 3.6-4.4 s after 130 s, a reset past the 10 s request limit after a few minutes).
    Here pings every 10 ms make that idle work ~10 times faster: 8 s of it (0.3 s of CPU) are more than
    a minute of an idle helper's."""
    monkeypatch.setattr(helper_process, "PING_INTERVAL", 0.01)
    registry = CollectorRegistry()
    Counter("llm_quiet_events", "Events.", registry=registry).inc()
    with start_http_server(0, registry=registry) as server:
        http_get(server.url)  # the budget's first look
        helper = _helper(psutil.Process())
        cpu = sum(helper.cpu_times()[:2])
        time.sleep(8.0)
        spent = sum(helper.cpu_times()[:2]) - cpu
        assert spent > 0.2, f"the helper spent {spent:.3f} s idle: too little to owe more than its burst"
        started = time.monotonic()
        body = http_get(server.url, timeout=10)[1]
        waited = time.monotonic() - started
    assert sample_value(body, "llm_quiet_events_total") == 1
    assert waited < 1.0, f"{waited:.2f} s for a scrape after the helper spent {spent:.3f} s idle"
