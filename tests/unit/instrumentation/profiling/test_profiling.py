"""On-demand captures in a real process: armed by the endpoint's ``/debug/profile``, taken by the forward
hooks on the thread that generates, bounded, one at a time, and gone without a trace when they end."""

from __future__ import annotations

import base64
import gzip
import json
import os
import ssl
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from inferwatch.instrumentation.endpoint.server import start_http_server
from inferwatch.instrumentation.profiling.captures import CAPTURES, ProfileConfig
from inferwatch.instrumentation.profiling.files import FILE_PREFIX, prune
from tests.support import http_get
from tests.support.certs import bcrypt_hash, self_signed_certificate

pytestmark = pytest.mark.matrix


def post(url: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    monkeypatch.setenv("INFERWATCH_PROFILE", "1")
    monkeypatch.setenv("INFERWATCH_PROFILE_DIR", str(tmp_path / "profiles"))
    monkeypatch.setenv("INFERWATCH_PROFILE_MAX_FILES", "2")
    server = start_http_server(port=0)
    try:
        yield server.url.removesuffix("/metrics")
    finally:
        server.close()


def wait_finished(base: str, capture_id: str, timeout: float = 60) -> dict[str, Any]:
    """The endpoint's state of the capture once it has ended (done or failed)."""
    ended = CAPTURES.get(capture_id).ended.wait(timeout)
    _, body = http_get(f"{base}/debug/profile?id={capture_id}")
    state = json.loads(body)
    if not ended or state["state"] not in ("done", "failed"):
        raise AssertionError(f"capture {capture_id} did not finish: {state}")
    return state


def wait_armed(capture_id: str | None = None) -> None:
    """Return once the capture is armed (or has ended before it could be)."""
    assert CAPTURES.get(capture_id).ready.wait(60), CAPTURES.get(capture_id)


def generate_until_armed_and_done(model: torch.nn.Module, base: str, capture_id: str) -> dict[str, Any]:
    wait_armed(capture_id)
    model.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=12, do_sample=False)
    return wait_finished(base, capture_id)


def test_a_capture_covers_the_next_steps_and_leaves_nothing_behind(llama, instrumented, endpoint) -> None:
    instrumented(llama)
    status, state = post(f"{endpoint}/debug/profile?steps=5&seconds=20")
    assert status == 202, state
    assert post(f"{endpoint}/debug/profile?steps=5")[0] == 409  # one at a time: refused, not queued
    done = generate_until_armed_and_done(llama, endpoint, state["id"])
    assert done["state"] == "done", done
    assert done["steps_captured"] == 5 and done["stopped_by"] == "steps"
    assert done["phases"] == {"prefill": 1, "decode": 4}
    assert not CAPTURES.armed and not torch.autograd.profiler._is_profiler_enabled
    with urllib.request.urlopen(f"{endpoint}/debug/profile/trace?id={state['id']}") as answer:
        trace = json.loads(gzip.decompress(answer.read()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"inferwatch.step prefill 0", "inferwatch.step decode 4"} <= names
    assert "inferwatch.step decode 5" not in names
    assert done["trace_bytes"] <= ProfileConfig().max_trace_bytes
    # Another capture is taken once this one is over.
    status, again = post(f"{endpoint}/debug/profile?steps=2")
    assert status == 202
    assert generate_until_armed_and_done(llama, endpoint, again["id"])["state"] == "done"


@pytest.mark.parametrize(("before", "after", "warned"), [(None, "1", False), ("0", "0", True)])
def test_a_capture_has_kineto_detach_cupti_unless_the_user_said_otherwise(
    llama, instrumented, endpoint, monkeypatch: pytest.MonkeyPatch, caplog, before, after, warned
) -> None:
    # Kineto leaves CUPTI attached after a trace unless TEARDOWN_CUPTI=1, and every kernel launch pays for
    # it from then on (docs/profiling.md); the variable is read when a trace stops.
    if before is None:
        monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    else:
        monkeypatch.setenv("TEARDOWN_CUPTI", before)
    instrumented(llama)
    status, state = post(f"{endpoint}/debug/profile?steps=2")
    assert status == 202, state
    with caplog.at_level("WARNING", logger="inferwatch.instrumentation.profiling.captures"):
        assert generate_until_armed_and_done(llama, endpoint, state["id"])["state"] == "done"
    assert os.environ["TEARDOWN_CUPTI"] == after
    assert ("CUPTI stays attached" in caplog.text) is warned


def test_a_capture_spans_the_requests_of_its_thread_and_no_other_thread(llama, instrumented, endpoint):
    instrumented(llama)
    status, state = post(f"{endpoint}/debug/profile?steps=15&seconds=20")
    assert status == 202
    wait_armed(state["id"])
    assert CAPTURES.armed
    llama.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=12, do_sample=False)
    # Another thread's forwards while the capture runs are neither counted nor profiled.
    worker = threading.Thread(
        target=lambda: llama.generate(torch.ones(1, 3, dtype=torch.long), max_new_tokens=4)
    )
    worker.start()
    worker.join()
    assert CAPTURES.get().state == "capturing" and CAPTURES.get().captured == 12
    llama.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=12, do_sample=False)
    done = wait_finished(endpoint, state["id"])
    assert done["steps_captured"] == 15 and done["stopped_by"] == "steps"
    assert done["phases"] == {"prefill": 2, "decode": 13}
    with urllib.request.urlopen(f"{endpoint}/debug/profile/trace?id={state['id']}") as answer:
        trace = json.loads(gzip.decompress(answer.read()))
    threads = {e["tid"] for e in trace["traceEvents"] if e.get("cat") == "cpu_op"}
    assert threads == {threading.get_native_id()}


def test_refusals(llama, instrumented, endpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    assert post(f"{endpoint}/debug/profile?steps=100000")[0] == 400
    assert post(f"{endpoint}/debug/profile?seconds=nan")[0] == 400
    assert post(f"{endpoint}/debug/profile?steps=x")[0] == 400
    assert http_get(f"{endpoint}/debug/profile/trace?id=../../etc/passwd")[0] == 404
    # Memory evidence is the CUDA allocator's: a CPU process refuses it, and records nothing.
    status, answer = post(f"{endpoint}/debug/profile?steps=2&memory=1")
    assert status == 400 and "CUDA" in answer["error"]
    assert post(f"{endpoint}/debug/oom?seconds=60")[0] == 400
    assert json.loads(http_get(f"{endpoint}/debug/oom")[1])["armed"] is False
    monkeypatch.setenv("INFERWATCH_PROFILE", "0")
    server = start_http_server(port=0)
    try:
        status, answer = post(server.url.removesuffix("/metrics") + "/debug/profile")
        assert status == 403 and "INFERWATCH_PROFILE=1" in answer["error"]
        assert http_get(server.url)[0] == 200  # the metrics are served as before
    finally:
        server.close()


def test_a_capture_without_steps_expires_and_a_trace_over_its_bound_is_refused(
    llama, instrumented, endpoint, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    instrumented(llama)
    status, state = post(f"{endpoint}/debug/profile?steps=3&seconds=0.5")
    assert status == 202
    expired = wait_finished(endpoint, state["id"])
    assert expired["state"] == "failed" and "no forward step" in expired["error"]
    assert not CAPTURES.armed
    monkeypatch.setenv("INFERWATCH_PROFILE_MAX_TRACE_BYTES", "1000")
    server = start_http_server(port=0)
    try:
        base = server.url.removesuffix("/metrics")
        status, state = post(f"{base}/debug/profile?steps=3")
        failed = generate_until_armed_and_done(llama, base, state["id"])
        assert failed["state"] == "failed" and "over the bound of 1000" in failed["error"], failed
        assert not list((tmp_path / "profiles").glob("*partial"))
    finally:
        server.close()


def test_only_the_newest_capture_files_are_kept(tmp_path: Path) -> None:
    for index in range(4):
        path = tmp_path / f"{FILE_PREFIX}{index}.json.gz"
        path.write_bytes(b"x")
        stamp = 1_000_000 + index
        os.utime(path, (stamp, stamp))
    (tmp_path / "unrelated.txt").write_text("mine")
    prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{FILE_PREFIX}2.json.gz", f"{FILE_PREFIX}3.json.gz", "unrelated.txt",
    ]  # fmt: skip


def test_configuration_from_the_environment() -> None:
    config = ProfileConfig.from_env({"INFERWATCH_PROFILE": "yes", "INFERWATCH_PROFILE_MAX_STEPS": "50"})
    assert config.enabled and config.max_steps == 50
    with pytest.raises(ValueError, match="INFERWATCH_PROFILE_MAX_SECONDS"):
        ProfileConfig.from_env({"INFERWATCH_PROFILE_MAX_SECONDS": "-1"})
    with pytest.raises(ValueError, match="INFERWATCH_PROFILE="):
        ProfileConfig.from_env({"INFERWATCH_PROFILE": "maybe"})


def test_the_web_configs_tls_and_basic_auth_cover_the_profile_routes(
    llama, instrumented, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cert, key = self_signed_certificate(tmp_path)
    config = tmp_path / "web.yml"
    config.write_text(
        f"tls_server_config: {{cert_file: {cert}, key_file: {key}}}\n"
        f"basic_auth_users: {{ops: '{bcrypt_hash('secret')}'}}\n"
    )
    monkeypatch.setenv("INFERWATCH_WEB_CONFIG_FILE", str(config))
    monkeypatch.setenv("INFERWATCH_PROFILE", "1")
    monkeypatch.setenv("INFERWATCH_PROFILE_DIR", str(tmp_path / "profiles"))
    context = ssl.create_default_context(cafile=str(cert))
    server = start_http_server(port=0)
    try:
        base = server.url.removesuffix("/metrics")
        assert base.startswith("https://")

        def call(path: str, method: str, password: str | None) -> int:
            headers = {}
            if password is not None:
                headers["Authorization"] = "Basic " + base64.b64encode(f"ops:{password}".encode()).decode()
            request = urllib.request.Request(base + path, method=method, headers=headers)
            try:
                with urllib.request.urlopen(request, timeout=10, context=context) as answer:
                    return answer.status
            except urllib.error.HTTPError as error:
                return error.code

        assert call("/debug/profile?steps=2", "POST", None) == 401
        assert call("/debug/profile?steps=2", "POST", "wrong") == 401
        assert call("/metrics", "GET", None) == 401
        assert call("/metrics", "GET", "secret") == 200
        assert not CAPTURES.armed
        assert call("/debug/profile?steps=2", "POST", "secret") == 202
        instrumented(llama)
        wait_armed()
        assert CAPTURES.armed
        llama.generate(torch.ones(1, 4, dtype=torch.long), max_new_tokens=4, do_sample=False)
        assert CAPTURES.get().ended.wait(30) and CAPTURES.get().state == "done"
    finally:
        server.close()
