"""The endpoint's helper process: what it imports, what it answers from, and that it never outlives the
serving process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import urllib.error
import urllib.request

import psutil
import pytest
from inferwatch.instrumentation.exposition import THREAD_NAME, start_http_server
from inferwatch.instrumentation.profiling_http import MAX_BODY_BYTES
from prometheus_client import CollectorRegistry, Counter

from tests.support import http_get, sample_value
from tests.support.services import wait_until

# A serving process in miniature: an endpoint on a free port, its port printed, then nothing but waiting.
_SERVING = textwrap.dedent(
    """
    import sys, time
    import torch  # the serving process has it loaded; its helper must not
    from prometheus_client import Counter
    from inferwatch.instrumentation.exposition import start_http_server
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
