"""``inferwatch top`` and ``inferwatch diagnose`` against real processes: an instrumented demo, an exporter
over the NVML stand-in (three fake GPUs, one throttle reason active), and real Prometheus servers.

The demo's model runs on the CPU, which has no busy ratio (docs/metrics.md): the host-bound diagnosis is
judged on the endpoint of a serving process on a GPU (tests/support/gpu_serving.py), with the busy ratio
an eager decode loop showed on the H200.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from inferwatch.common.promql import Selector
from inferwatch.monitor.expr import Quantile, Rate
from inferwatch.monitor.scrape import EndpointScrape, Sample, Snapshot, labels_of
from tests.support import REPO_ROOT, http_get, parse_samples, sample_value
from tests.support.gpu_serving import GpuServing, gpu_serving
from tests.support.services import (
    Prometheus,
    RunningProcess,
    require_binary,
    run_inferwatch,
    start_demo,
    start_exporter,
    start_prometheus,
    wait_until,
)

pytestmark = pytest.mark.integration

FAKE_NVML_ENV = {
    "INFERWATCH_EXPORTER_NVML_MODULE": "tests.support.fake_nvml",
    "FAKE_NVML_SCENARIO": json.dumps({"gpus": 3}),
    "PYTHONPATH": str(REPO_ROOT),
}
EXPORTER_FLAGS = ["--collector.interval=200ms", "--collector.timeout=2s"]
# One poll at start and none during the module: the exporter serves the same text to top and to the test,
# so top's figures can be compared with the scraped ones exactly.
FROZEN_EXPORTER_FLAGS = ["--collector.interval=1h", "--collector.timeout=10s"]
DEMO_ARGS = {"model": "tiny-llama", "duration": 300.0, "max_new_tokens": 16}
# On a GPU: a host-side sleep per decode step far longer than a tiny model's step keeps the GPU idle.
STEP_SLEEP_SECONDS = 0.02


def scrape(address: str) -> str:
    status, body = http_get(f"http://{address}/metrics")
    assert status == 200
    return body


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningProcess, str]]:
    """A healthy instrumented demo: tiny-llama, requests back to back."""
    with start_demo(**DEMO_ARGS, workdir=tmp_path_factory.mktemp("demo")) as running:
        yield running


@pytest.fixture(scope="module")
def host_bound() -> Iterator[GpuServing]:
    """A serving process on a GPU whose decode loop is host-bound."""
    with gpu_serving("tiny-llama") as serving:
        yield serving


@pytest.fixture(scope="module")
def exporter(
    tmp_path_factory: pytest.TempPathFactory, demo: tuple[RunningProcess, str]
) -> Iterator[tuple[RunningProcess, str]]:
    """The exporter over three fake GPUs, watching the healthy demo's process through a PID file; frozen
    after its first poll."""
    workdir = tmp_path_factory.mktemp("exporter")
    pid_file = workdir / "demo.pid"
    pid_file.write_text(str(demo[0].popen.pid))
    with start_exporter(
        extra_args=[*FROZEN_EXPORTER_FLAGS, f"--processes.pid-file={pid_file}"],
        env=FAKE_NVML_ENV,
        workdir=workdir,
    ) as running:
        wait_until(lambda: "gpu_info{" in scrape(running[1]), 30, "the exporter's first poll")
        yield running


def wait_for_traffic(address: str, minimum_tokens: float = 50) -> None:
    """Until the demo has generated tokens (its model is loaded and serving)."""
    wait_until(
        lambda: (sample_value(scrape(address), "llm_generation_tokens_total") or 0) >= minimum_tokens,
        120,
        f"{address} to generate {minimum_tokens} tokens",
    )


def required(text: str, metric: str, **labels: str) -> float:
    """The value of a sample that must be in ``text``."""
    value = sample_value(text, metric, **labels)
    assert value is not None, (metric, labels)
    return value


def test_top_once_shows_the_exporters_numbers(
    demo: tuple[RunningProcess, str], exporter: tuple[RunningProcess, str]
) -> None:
    (demo_proc, demo_address), (_, exporter_address) = demo, exporter
    wait_for_traffic(demo_address)
    result = run_inferwatch("top", "--once", "--json", "--window", "1", demo_address, exporter_address)
    assert result.returncode == 0, result.stderr
    frame = json.loads(result.stdout)
    text = scrape(exporter_address)  # the stand-in's figures are constant between scrapes

    assert [e["up"] for e in frame["endpoints"]] == [True, True]
    assert [g["gpu"] for g in frame["gpus"]] == ["0", "1", "2"]
    for gpu in frame["gpus"]:
        index = gpu["gpu"]
        assert gpu["instance"] == exporter_address
        assert gpu["name"] == next(
            s.labels["name"] for s in parse_samples(text) if s.name == "gpu_info" and s.labels["gpu"] == index
        )
        assert gpu["utilization"] == required(text, "gpu_utilization_ratio", gpu=index)
        assert gpu["memory_used_bytes"] == required(text, "gpu_memory_used_bytes", gpu=index)
        assert gpu["memory_free_bytes"] == required(text, "gpu_memory_free_bytes", gpu=index)
        assert gpu["memory_total_bytes"] == required(text, "gpu_memory_total_bytes", gpu=index)
        assert gpu["power_watts"] == required(text, "gpu_power_watts", gpu=index)
        assert gpu["power_limit_watts"] == required(text, "gpu_power_limit_watts", gpu=index)
        assert gpu["sm_clock_hz"] == required(text, "gpu_clock_hz", gpu=index, clock="sm")
        assert gpu["sm_clock_max_hz"] == required(text, "gpu_clock_max_hz", gpu=index, clock="sm")
        assert gpu["temperature_celsius"] == required(
            text, "gpu_temperature_celsius", gpu=index, sensor="gpu"
        )
        assert gpu["slowdown_celsius"] == required(
            text, "gpu_temperature_threshold_celsius", gpu=index, kind="slowdown"
        )
        active = [
            s.labels["reason"]
            for s in parse_samples(text)
            if s.name == "gpu_clocks_event_active" and s.labels["gpu"] == index and s.value == 1
        ]
        assert gpu["throttle_reasons"] == active == ["sw_power_cap"]

    (model,) = frame["models"]
    assert (model["instance"], model["model"], model["device"]) == (demo_address, "tiny-llama", "cpu")
    assert model["ttft_p50_seconds"] <= model["ttft_p99_seconds"]
    assert model["itl_p50_seconds"] <= model["itl_p99_seconds"]
    assert model["busy_ratio"] is None  # a model on the CPU: no GPU to be busy
    (process,) = frame["processes"]
    pid = str(demo_proc.popen.pid)
    assert process["pid"] == pid
    assert process["resident_memory_bytes"] == required(
        text, "inferwatch_process_resident_memory_bytes", pid=pid
    )
    assert process["cpu_cores"] == 0.0  # a frozen exporter: its CPU counters did not move
    (host,) = frame["hosts"]
    assert host["cpus"] == required(text, "host_cpus")
    assert host["memory_available_bytes"] == required(text, "host_memory_available_bytes")

    rendered = run_inferwatch("top", "--once", "--window", "0.5", demo_address, exporter_address)
    assert rendered.returncode == 0, rendered.stderr
    assert "\x1b[" not in rendered.stdout
    gpu0 = frame["gpus"][0]
    for figure in (
        f"{gpu0['memory_used_bytes'] / 2**30:.1f}/{gpu0['memory_total_bytes'] / 2**30:.1f} GiB",
        f"{gpu0['power_watts']:.0f}/{gpu0['power_limit_watts']:.0f} W",
        f"{gpu0['sm_clock_hz'] / 1e6:.0f}/{gpu0['sm_clock_max_hz'] / 1e6:.0f} MHz",
        "sw_power_cap",
        "tiny-llama",
        "2/2 endpoints up",
    ):
        assert figure in rendered.stdout


def test_top_once_tokens_per_second_is_the_counter_difference(demo: tuple[RunningProcess, str]) -> None:
    _, address = demo
    wait_for_traffic(address)
    before = sample_value(scrape(address), "llm_generation_tokens_total")
    result = run_inferwatch("top", "--once", "--json", "--window", "1.5", address)
    after = sample_value(scrape(address), "llm_generation_tokens_total")
    assert result.returncode == 0, result.stderr
    frame = json.loads(result.stdout)
    (model,) = frame["models"]
    # One endpoint: the frame's window is the time between its two scrapes, so rate x window is the
    # counter's increase between them: a whole number of tokens, within what the test saw around it.
    tokens = model["tokens_per_second"] * frame["window_seconds"]
    assert tokens == pytest.approx(round(tokens), abs=1e-6)
    assert 0 < round(tokens) <= after - before


@pytest.fixture(scope="module")
def prometheus_servers(
    demo: tuple[RunningProcess, str], host_bound: GpuServing, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Prometheus]]:
    """One Prometheus per serving process, started together so that their histories fill at the same
    time, and only once the demo serves: its start-up (importing torch, building and warming up the model)
    is a burst of CPU that must not be in the histories the diagnoses judge."""
    wait_for_traffic(demo[1])
    wait_for_traffic(host_bound.address, minimum_tokens=10)
    with (
        start_prometheus({"demo": [demo[1]]}, workdir=tmp_path_factory.mktemp("prom-healthy")) as healthy,
        start_prometheus(
            {"demo": [host_bound.address]}, workdir=tmp_path_factory.mktemp("prom-host-bound")
        ) as host_bound_prometheus,
    ):
        yield {"healthy": healthy, "host-bound": host_bound_prometheus}


@pytest.fixture
def prometheus_healthy(prometheus_servers: dict[str, Prometheus]) -> Prometheus:
    return prometheus_servers["healthy"]


@pytest.fixture
def prometheus_host_bound(prometheus_servers: dict[str, Prometheus]) -> Prometheus:
    return prometheus_servers["host-bound"]


def wait_for_history(prometheus: Prometheus, seconds: float) -> float:
    """Until Prometheus holds ``seconds`` of generated-token history; returns the newest sample's time."""
    return prometheus.wait_for_history("llm_generation_tokens_total", seconds)


# Fluctuation is the coefficient of variation of per-step mean latencies, and on a CPU the demo's latency
# is its share of the cores: other jobs on a shared 2-core machine change it in steps (one more busy
# process can halve it). Each step's mean is a rate over RATE_WINDOW; consecutive steps share all of it
# but the step, so a change of speed moves the means by at most about window/RATE_WINDOW of its size.
# With rates over 6 s for 12 s, a single slowdown by x2 at the wrong moment read as 30 % fluctuation;
# with rates over 30 s for 6 s (4 steps), only a slowdown by more than x6.9 can (the test's own
# start-ups are kept out of the window as well: see prometheus_servers). The default is rates over 1m
# for the last 10m.
RATE_WINDOW_SECONDS = 30
DIAGNOSE_WINDOW = ("--window", "6s", "--step", "2s", "--rate-window", f"{RATE_WINDOW_SECONDS}s")
HISTORY_SECONDS = 6 + RATE_WINDOW_SECONDS + 2


def diagnose_prometheus(prometheus: Prometheus) -> tuple[int, dict[str, Any], str]:
    result = run_inferwatch("diagnose", "--prometheus", prometheus.url, *DIAGNOSE_WINDOW, "--json")
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout), result.stderr


def test_diagnose_finds_nothing_alarming_in_a_healthy_demo(prometheus_healthy: Prometheus) -> None:
    # The first test to use Prometheus: its window holds the demos serving and nothing else of this suite
    # (a subprocess of ours starting up competes for the 2 cores, and that is what fluctuation measures).
    wait_for_history(prometheus_healthy, HISTORY_SECONDS)
    code, report, _ = diagnose_prometheus(prometheus_healthy)
    assert code == 0, report["findings"]
    assert report["alarming"] is False
    assert [f for f in report["findings"] if f["severity"] != "info"] == []
    # A model on the CPU has no GPU busy ratio: the check says so rather than judge the host by it.
    assert "host-bound" in report["not_assessed"], report
    assert "on the CPU" in report["not_assessed"]["host-bound"]
    assert "fluctuation" in report["passed"]  # judged steady, not left unassessed


def test_diagnose_reports_a_host_bound_gpu_process(
    prometheus_host_bound: Prometheus, host_bound: GpuServing
) -> None:
    wait_for_history(prometheus_host_bound, HISTORY_SECONDS)
    code, report, _ = diagnose_prometheus(prometheus_host_bound)
    assert code == 1
    findings = [f for f in report["findings"] if f["check"] == "host-bound"]
    assert [f["subject"] for f in findings] == [f"model tiny-llama on {host_bound.address}"]
    busy, _, forwards = findings[0]["evidence"][:3]
    assert busy["query"] == "avg by (job, instance, model) (llm_gpu_busy_ratio)"
    assert busy["value"] == "11%"
    assert forwards["query"] == "avg by (job, instance, model) (llm_forward_time_ratio)"
    assert forwards["value"] == "90%"


def test_diagnose_on_live_endpoints(host_bound: GpuServing, exporter: tuple[RunningProcess, str]) -> None:
    result = run_inferwatch(
        "diagnose", "--endpoint", host_bound.address, "--endpoint", exporter[1], "--samples", "4",
        "--interval", "1", "--json",
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    found = {(f["check"], f["subject"]) for f in report["findings"]}
    assert ("host-bound", f"model tiny-llama on {host_bound.address}") in found
    # The stand-in holds every GPU at its software power cap.
    for gpu in ("0", "1", "2"):
        assert ("throttling", f"GPU {gpu} on {exporter[1]}") in found
    throttling = next(f for f in report["findings"] if f["check"] == "throttling")
    assert throttling["severity"] == "warning"
    assert throttling["evidence"][0]["what"].startswith("sw_power_cap active")


def test_local_quantiles_and_rates_equal_prometheus(
    prometheus_healthy: Prometheus, demo: tuple[RunningProcess, str]
) -> None:
    """The two-scrape arithmetic of top and diagnose --endpoint is Prometheus's: evaluated on the very
    samples Prometheus stored at two times, it gives what histogram_quantile and a counter difference
    give on the server."""
    end = wait_for_history(prometheus_healthy, 8)
    span = 5

    def snapshot_at(at: float, metric: str) -> Snapshot:
        answer = prometheus_healthy.api("query", query=metric, time=f"{at:.3f}")["result"]
        samples = tuple(Sample(metric, labels_of(r["metric"]), float(r["value"][1])) for r in answer)
        return Snapshot((EndpointScrape("prometheus", demo[1], at, 0.0, samples),))

    itl = Selector("llm_inter_token_latency_seconds")
    bucket = "llm_inter_token_latency_seconds_bucket"
    window = f"{bucket} - {bucket} offset {span}s"  # the exact increase, without rate()'s extrapolation
    earlier, later = (snapshot_at(t, bucket) for t in (end - span, end))
    for q in (0.5, 0.9, 0.99):
        server = prometheus_healthy.api(
            "query",
            query=f"histogram_quantile({q}, sum by (le, instance, model) ({window}))",
            time=f"{end:.3f}",
        )["result"]
        local = Quantile(q, itl, ("instance", "model")).evaluate(earlier, later)
        assert {labels_of(r["metric"]): float(r["value"][1]) for r in server} == pytest.approx(
            local, rel=1e-12
        )

    tokens = "llm_generation_tokens_total"
    earlier, later = (snapshot_at(t, tokens) for t in (end - span, end))
    server = prometheus_healthy.api(
        "query",
        query=f"sum by (instance, model) ({tokens} - {tokens} offset {span}s) / {span}",
        time=f"{end:.3f}",
    )["result"]
    local = Rate(Selector(tokens), ("instance", "model")).evaluate(earlier, later)
    assert local and {labels_of(r["metric"]): float(r["value"][1]) for r in server} == pytest.approx(local)


def test_top_shows_an_exporter_that_goes_away_and_keeps_running(tmp_path: Path) -> None:
    output = tmp_path / "top.txt"
    with start_exporter(extra_args=EXPORTER_FLAGS, env=FAKE_NVML_ENV, workdir=tmp_path) as (
        exporter_proc,
        address,
    ):
        with output.open("w") as sink:
            top = subprocess.Popen(
                [require_binary("inferwatch"), "top", address, "--interval", "0.3", "--timeout", "1"],
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_until(lambda: "1/1 endpoints up" in output.read_text(), 30, "top to show the exporter up")
            exporter_proc.stop()
            wait_until(
                lambda: "down: connection failed: Connection refused" in output.read_text(),
                30,
                "top to show the exporter down",
            )
            time.sleep(1.0)  # a few more refreshes against nothing
            assert top.poll() is None, output.read_text()
            assert "0/1 endpoints up" in output.read_text()
            top.send_signal(signal.SIGINT)
            assert top.wait(timeout=10) == 0
        finally:
            if top.poll() is None:
                top.kill()
                top.wait(timeout=10)
    assert "Traceback" not in output.read_text()


@pytest.mark.gpu
def test_top_and_diagnose_on_a_real_gpu(tmp_path: Path) -> None:
    """On a CUDA machine: the real exporter (NVML) and a host-bound demo on the GPU."""
    with (
        start_demo(**DEMO_ARGS, step_sleep=STEP_SLEEP_SECONDS, workdir=tmp_path / "demo") as (
            _,
            demo_address,
        ),
        start_exporter(extra_args=EXPORTER_FLAGS, workdir=tmp_path / "exporter") as (_, exporter_address),
    ):
        wait_for_traffic(demo_address, minimum_tokens=10)
        result = run_inferwatch("top", "--once", "--json", "--window", "1", demo_address, exporter_address)
        assert result.returncode == 0, result.stderr
        frame = json.loads(result.stdout)
        text = scrape(exporter_address)
        assert frame["gpus"], "no GPU rows"
        for gpu in frame["gpus"]:
            assert gpu["memory_total_bytes"] == required(text, "gpu_memory_total_bytes", gpu=gpu["gpu"])
            assert gpu["power_limit_watts"] == required(text, "gpu_power_limit_watts", gpu=gpu["gpu"])
            assert gpu["sm_clock_max_hz"] == required(text, "gpu_clock_max_hz", gpu=gpu["gpu"], clock="sm")
            assert 0 <= gpu["utilization"] <= 1
        (model,) = frame["models"]
        assert model["device"].startswith("cuda")
        # The model's GPU as NVML names it, in the serving process and in the exporter: one UUID, the one
        # nvidia-smi gives, and each side finds the other by it.
        assert model["gpu_uuid"] in nvidia_smi_uuids()
        (its_gpu,) = [gpu for gpu in frame["gpus"] if gpu["uuid"] == model["gpu_uuid"]]
        assert (model["gpu"], model["gpu_instance"]) == (its_gpu["gpu"], exporter_address)
        assert its_gpu["serving"] == [f"model tiny-llama on {demo_address}"]

        diagnosis = run_inferwatch(
            "diagnose", "--endpoint", demo_address, "--endpoint", exporter_address,
            "--samples", "4", "--interval", "1", "--json",
        )  # fmt: skip
        report = json.loads(diagnosis.stdout)
        assert ("host-bound", f"model tiny-llama on {demo_address}") in {
            (f["check"], f["subject"]) for f in report["findings"]
        }, (report, scrape(demo_address))


def nvidia_smi_uuids() -> set[str]:
    """The GPUs' UUIDs as nvidia-smi lists them: the driver's word, independent of NVML's Python binding."""
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.strip() for line in listed.stdout.splitlines() if line.strip()}


@pytest.mark.gpu
def test_the_launch_bound_finding_names_the_model_on_its_gpu(tmp_path: Path) -> None:
    """On a CUDA machine: a tiny model decoding flat out is a stream of tiny kernels (the SMs idle while
    kernels run); the finding on its GPU names the model, joined by the GPU's UUID."""
    with (
        start_demo(**DEMO_ARGS, workdir=tmp_path / "demo") as (_, demo_address),
        start_exporter(extra_args=EXPORTER_FLAGS, workdir=tmp_path / "exporter") as (_, exporter_address),
    ):
        wait_for_traffic(demo_address, minimum_tokens=10)
        diagnosis = run_inferwatch(
            "diagnose", "--endpoint", demo_address, "--endpoint", exporter_address,
            "--samples", "4", "--interval", "1", "--json",
        )  # fmt: skip
        report = json.loads(diagnosis.stdout)
        launch_bound = [f for f in report["findings"] if f["check"] == "launch-bound"]
        assert launch_bound, report
        assert launch_bound[0]["summary"].endswith(f"; it serves model tiny-llama on {demo_address}"), report
