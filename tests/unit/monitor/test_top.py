"""``inferwatch top``: the frame computed from two scrapes, its rendering, and the command's edges."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from rich.console import Console
from rich.text import Text

from inferwatch.cli import main as cli_main
from inferwatch.monitor import top
from inferwatch.monitor.frame import GpuRow, ModelRow, build_frame
from inferwatch.monitor.scrape import EndpointScrape
from inferwatch.monitor.top import GPU_COLUMNS, MODEL_COLUMNS, PIPE_WIDTH, Screen
from tests.support import free_port
from tests.unit.monitor.snapshots import endpoint, snapshot


def exporter_registry(throttle: str | None) -> CollectorRegistry:
    r = CollectorRegistry()
    labels = {"gpu": "0", "uuid": "GPU-0"}
    g = list(labels)

    def gauge(name: str, value: float, **extra: str) -> None:
        Gauge(name, "", [*g, *extra], registry=r).labels(**labels, **extra).set(value)

    Gauge("gpu_info", "", [*g, "name"], registry=r).labels(**labels, name="Test GPU").set(1)
    gauge("gpu_utilization_ratio", 0.75)
    sm_active = Gauge("gpu_sm_active_ratio", "", [*g, "gpu_instance"], registry=r)
    sm_active.labels(**labels, gpu_instance="").set(0.04)  # far below utilization: launch-bound
    sm_active.labels(**labels, gpu_instance="1").set(0.5)  # a MIG instance: not the GPU's figure
    gauge("gpu_memory_used_bytes", 60 * 2**30)
    gauge("gpu_memory_free_bytes", 20 * 2**30)
    gauge("gpu_memory_total_bytes", 80 * 2**30)
    gauge("gpu_power_watts", 412)
    gauge("gpu_power_limit_watts", 700)
    gauge("gpu_clock_hz", 1410e6, clock="sm")
    gauge("gpu_clock_max_hz", 1980e6, clock="sm")
    gauge("gpu_temperature_celsius", 86, sensor="gpu")
    gauge("gpu_temperature_threshold_celsius", 89, kind="slowdown")
    active = Gauge("gpu_clocks_event_active", "", [*g, "reason"], registry=r)
    for reason in ("gpu_idle", "sw_power_cap", "hw_slowdown"):
        active.labels(**labels, reason=reason).set(1 if reason in (throttle, "gpu_idle") else 0)
    pods = Gauge("gpu_kubernetes_pod_info", "", [*g, "namespace", "pod", "container"], registry=r)
    pods.labels(**labels, namespace="llm", pod="llama-0", container="server").set(1)
    return r


class ServingProcess:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.itl = Histogram(
            "llm_inter_token_latency_seconds", "", ["model"], buckets=(0.01, 0.02, 0.04), registry=r
        )
        self.ttft = Histogram(
            "llm_time_to_first_token_seconds", "", ["model"], buckets=(0.1, 0.2), registry=r
        )
        self.queue = Histogram(
            "llm_request_queue_seconds", "", ["model"], buckets=(0.5, 1.0, 2.0), registry=r
        )
        self.tokens = Counter("llm_generation_tokens", "", ["model"], registry=r)
        self.finished = Counter("llm_requests_finished", "", ["model", "finish_reason"], registry=r)
        for reason in ("stop", "length", "cancelled", "error", "oom"):  # as the instrumentation has them
            self.finished.labels("llama", reason)
        Gauge("llm_requests_running", "", ["model"], registry=r).labels("llama").set(3)
        Gauge("llm_requests_waiting", "", ["model"], registry=r).labels("llama").set(7)
        Gauge("llm_request_oldest_running_age_seconds", "", ["model"], registry=r).labels("llama").set(725.4)
        Gauge("llm_kv_cache_bytes", "", ["model"], registry=r).labels("llama").set(3 * 2**20)
        d = ["model", "device", "uuid"]
        Gauge("llm_gpu_busy_ratio", "", d, registry=r).labels("llama", "cuda:0", "GPU-0").set(0.3)
        Gauge("llm_model_info", "", d, registry=r).labels("llama", "cuda:0", "GPU-0").set(1)

    def generate(self, tokens: int, itl: float) -> None:
        self.tokens.labels("llama").inc(tokens)
        for _ in range(tokens):
            self.itl.labels("llama").observe(itl)
        self.ttft.labels("llama").observe(0.15)
        self.queue.labels("llama").observe(1.5)


def two_rounds() -> tuple:
    serving, gpu = ServingProcess(), exporter_registry("sw_power_cap")
    serving.generate(1000, 0.001)  # before the window
    first = snapshot(endpoint(serving.registry, 10.0, "serving:8797"), endpoint(gpu, 10.0, "node:8798"))
    serving.generate(80, 0.015)
    for reason in ("stop", "length", "length", "length"):
        serving.finished.labels("llama", reason).inc()
    second = snapshot(endpoint(serving.registry, 12.0, "serving:8797"), endpoint(gpu, 12.0, "node:8798"))
    return first, second


def rendered(frame: object) -> str:
    """The frame as printed to a pipe: every column."""
    out = io.StringIO()
    Console(file=out, width=PIPE_WIDTH).print(Screen(frame))
    return out.getvalue()


def model_cell(row: ModelRow, header: str) -> Text:
    return next(column for column in MODEL_COLUMNS if column.header == header).cell(row)


def gpu_cell(row: GpuRow, header: str) -> Text:
    return next(column for column in GPU_COLUMNS if column.header == header).cell(row)


def waiting_style(row: ModelRow) -> str:
    """The style of the waiting figure in the run/wait cell."""
    cell = model_cell(row, "run/\nwait")
    return next((str(span.style) for span in cell.spans if span.start > cell.plain.index("/")), "")


def test_frame_values() -> None:
    frame = build_frame(*two_rounds())
    assert frame.window_seconds == 2.0
    (gpu,) = frame.gpus
    assert (gpu.instance, gpu.gpu, gpu.name) == ("node:8798", "0", "Test GPU")
    assert (gpu.utilization, gpu.power_watts, gpu.power_limit_watts) == (0.75, 412, 700)
    assert gpu.sm_active == 0.04
    assert gpu_cell(gpu, "SM\nactive").style == "yellow"  # 4 % of the SMs at 75 %: launch-bound
    assert (gpu.sm_clock_hz, gpu.sm_clock_max_hz) == (1410e6, 1980e6)
    assert gpu.throttle_reasons == ("sw_power_cap",)  # gpu_idle is not throttling
    # Joined by the GPU's UUID: the serving endpoint is another instance on another host.
    assert gpu.serving == ("model llama on serving:8797", "pod llm/llama-0")
    (model,) = frame.models
    assert (model.instance, model.model, model.device) == ("serving:8797", "llama", "cuda:0")
    assert (model.gpu_uuid, model.gpu, model.gpu_instance) == ("GPU-0", "0", "node:8798")
    assert model.gpu_throttle_reasons == ("sw_power_cap",)
    assert model.gpu_sm_clock_ratio == pytest.approx(1410 / 1980)
    assert model.tokens_per_second == 40.0  # 80 tokens in 2 s; the 1000 before the window do not count
    # All 80 window observations lie in (0.01, 0.02]: p50 is its middle, p99 near its top.
    assert model.itl_p50_seconds == pytest.approx(0.015)
    assert model.itl_p99_seconds == pytest.approx(0.0199)
    assert model.requests_running == 3 and model.busy_ratio == 0.3
    # Seven arrived requests wait; the window's one queue time lies in (1, 2]: p99 near its top.
    assert model.requests_waiting == 7
    assert model.queue_p99_seconds == pytest.approx(1.99)
    assert model.oldest_running_age_seconds == 725.4


def test_first_frame_has_no_rates() -> None:
    _, second = two_rounds()
    frame = build_frame(None, second)
    assert frame.window_seconds is None
    assert frame.models[0].tokens_per_second is None and frame.models[0].itl_p50_seconds is None
    assert frame.gpus[0].power_watts == 412
    assert "first scrape, no rates yet" in rendered(frame)


def test_render_shows_the_figures() -> None:
    text = rendered(build_frame(*two_rounds()))
    assert "60.0/80.0 GiB" in text and "25%" in text  # used/total, free share
    assert "412/700 W" in text
    assert "active" in text and "4.0%" in text  # SM active
    assert "1410/1980 MHz" in text
    assert "86/89 °C" in text
    assert "sw_power_cap" in text and "gpu_idle" not in text
    assert "model llama on serving:8797, pod llm/llama-0" in text  # the GPU's users
    assert "0: 71% sw_power_cap" in text  # the model's GPU, its SM clock share and throttling
    assert "25/75/0/0" in text  # the window's finish reasons: stop, length, cancelled, failed
    assert "15/19.9 ms" in text  # ITL p50 / p99
    assert "40.0" in text and "3.00 MiB" in text and "30%" in text
    assert "queue" in text and "1.99 s" in text
    assert "wait" in text and " 3/7 " in text
    assert "2/2 endpoints up" in text


def test_waiting_and_queue_time_above_the_alert_thresholds_are_yellow() -> None:
    (model,) = build_frame(*two_rounds()).models
    requests, queue = model_cell(model, "run/\nwait"), model_cell(model, "queue\np99")
    assert (str(requests), waiting_style(model)) == ("3/7", "yellow")  # InferwatchRequestsQueueing: above 4
    assert (str(queue), queue.style) == ("1.99 s", "yellow")  # InferwatchQueueTimeHigh: above 1 s
    quiet = dataclasses.replace(model, requests_waiting=4, queue_p99_seconds=None)
    assert waiting_style(quiet) == ""
    assert str(model_cell(quiet, "queue\np99")) == "-"


def test_a_request_older_than_the_stuck_bound_is_yellow() -> None:
    (model,) = build_frame(*two_rounds()).models
    oldest = model_cell(model, "oldest")
    assert (str(oldest), oldest.style) == ("12m 05s", "yellow")  # InferwatchRequestStuck: above 600 s
    cases = ((600.0, "10m 00s", ""), (0.0, "0 s", ""), (42.4, "42 s", ""), (5400.0, "1.5 h", "yellow"))
    for age, shown, style in cases:
        oldest = model_cell(dataclasses.replace(model, oldest_running_age_seconds=age), "oldest")
        assert (str(oldest), oldest.style) == (shown, style)
    assert str(model_cell(dataclasses.replace(model, oldest_running_age_seconds=None), "oldest")) == "-"


def paged_rounds() -> tuple:
    """A continuous-batching model with a paged KV cache 94 % full that preempts 3 requests in the 2 s
    window, next to a model served by generate whose preemption counter stays at zero."""
    r = CollectorRegistry()
    blocks = Gauge("llm_kv_cache_blocks", "", ["model", "state"], registry=r)
    blocks.labels("cb", "used").set(470)
    blocks.labels("cb", "total").set(500)
    preemptions = Counter("llm_kv_cache_preemptions", "", ["model"], registry=r)
    preemptions.labels("cb").inc(10)
    preemptions.labels("gen").inc(0)
    first = snapshot(endpoint(r, 10.0, "serving:8797"))
    preemptions.labels("cb").inc(3)
    return first, snapshot(endpoint(r, 12.0, "serving:8797"))


def test_paged_kv_cache_blocks_and_preemptions() -> None:
    cb, gen = build_frame(*paged_rounds()).models
    assert (cb.model, gen.model) == ("cb", "gen")
    assert cb.kv_blocks_used_ratio == 0.94
    assert cb.kv_preemptions_per_second == 1.5  # 3 in 2 s; the 10 before the window do not count
    assert gen.kv_blocks_used_ratio is None and gen.kv_preemptions_per_second == 0.0
    blocks, preempt = "KV blocks used", "preempt\n/s"
    # Yellow above InferwatchKvCacheNearlyFull's 90 % and InferwatchKvCachePreemptions' none per 5m.
    assert (str(model_cell(cb, blocks)), model_cell(cb, blocks).style) == ("94%", "yellow")
    assert (str(model_cell(cb, preempt)), model_cell(cb, preempt).style) == ("1.5", "yellow")
    # Without a paged cache both are "-", not a misleading 0.
    assert str(model_cell(gen, blocks)) == "-" and str(model_cell(gen, preempt)) == "-"
    calm = dataclasses.replace(cb, kv_blocks_used_ratio=0.9, kv_preemptions_per_second=0.0)
    assert [model_cell(calm, c).style for c in (blocks, preempt)] == ["", ""]
    assert str(model_cell(calm, preempt)) == "0"
    text = rendered(build_frame(*paged_rounds()))
    assert "KV blocks" in text and "preempt" in text and "94%" in text


def test_render_shows_a_down_endpoint() -> None:
    first, second = two_rounds()
    down = EndpointScrape(
        "http://gone:1/metrics", "gone:1", 12.0, 0.001, error="connection failed: Connection refused"
    )
    frame = build_frame(first, snapshot(*second.endpoints, down))
    text = rendered(frame)
    assert "2/3 endpoints up" in text
    assert "down: connection failed: Connection refused" in text


def test_once_against_nothing_is_down_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    assert cli_main(["top", "--once", "--window", "0.1", url]) == 1
    out, err = capsys.readouterr()
    assert f"{url} is down: connection failed: Connection refused" in err
    assert "0/1 endpoints up" in out
    assert "\x1b[" not in out  # not a terminal: plain text


def test_once_json(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    assert cli_main(["top", "--once", "--json", "--window", "0.1", url]) == 1
    frame = json.loads(capsys.readouterr().out)
    assert frame["endpoints"][0]["up"] is False
    assert frame["gpus"] == [] and frame["models"] == []


@pytest.mark.parametrize(
    "argv",
    [
        ["--json"],
        ["--interval", "0"],
        ["--window", "-1"],
        ["--interval", "x"],
        ["--columns", "10"],
        ["--view", "x"],
    ],
)
def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    try:
        code = cli_main(["top", *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    assert code == 2
    assert capsys.readouterr().err


def test_default_urls_follow_the_default_ports() -> None:
    from inferwatch.exporter.config import DEFAULT_PORT as EXPORTER_PORT
    from inferwatch.instrumentation.endpoint.server import DEFAULT_PORT as SERVING_PORT

    assert f"http://127.0.0.1:{SERVING_PORT}/metrics" == top.SERVING_DEFAULT_URL
    assert f"http://127.0.0.1:{EXPORTER_PORT}/metrics" == top.EXPORTER_DEFAULT_URL


def test_the_monitor_never_imports_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, inferwatch.monitor.top, inferwatch.monitor.diagnose; "
        "sys.exit(1 if 'torch' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def speculative_rounds() -> tuple:
    """A model that speculates (40 draft tokens in the 2 s window, 30 accepted) next to one that does
    not (no such series)."""
    r = CollectorRegistry()
    draft = Counter("llm_spec_decode_draft_tokens", "", ["model"], registry=r)
    accepted = Counter("llm_spec_decode_accepted_tokens", "", ["model"], registry=r)
    Gauge("llm_requests_running", "", ["model"], registry=r).labels("plain").set(1)
    draft.labels("assisted").inc(100)
    accepted.labels("assisted").inc(50)
    first = snapshot(endpoint(r, 10.0, "serving:8797"))
    draft.labels("assisted").inc(40)
    accepted.labels("assisted").inc(30)
    return first, snapshot(endpoint(r, 12.0, "serving:8797"))


def test_speculative_acceptance_column_only_where_a_model_has_draft_tokens() -> None:
    frame = build_frame(*speculative_rounds())
    assisted, plain = frame.models
    assert (assisted.model, plain.model) == ("assisted", "plain")
    assert assisted.spec_draft_tokens_per_second == 20.0
    assert assisted.spec_acceptance_ratio == 0.75  # of the window's drafts, not the 50 % before it
    assert plain.spec_draft_tokens_per_second is None and plain.spec_acceptance_ratio is None
    text = rendered(frame)
    assert "spec" in text and "accept" in text and "75%" in text
    # No model speculates: no column.
    assert "accept" not in rendered(build_frame(*two_rounds()))
