"""``inferwatch diagnose``: the report, its JSON, and the command's edges (real HTTP, nothing listening)."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from inferwatch.cli import main as cli_main
from inferwatch.monitor import diagnose
from tests.support import free_port
from tests.unit.monitor.simulation import run
from tests.unit.monitor.test_scrape import http_server


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = cli_main(["diagnose", *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


# The exporter's and the alert configuration's syntax too (inferwatch.common.durations): 1d, 1h30m, 5.
@pytest.mark.parametrize(
    ("text", "seconds"),
    [("500ms", 0.5), ("30s", 30), ("5m", 300), ("1.5h", 5400), ("1d", 86400), ("1h30m", 5400), ("5", 5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert diagnose.duration_option(text) == seconds


@pytest.mark.parametrize("text", ["", "-1m", "0s", "m", "5 minutes", "30m1h"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        diagnose.duration_option(text)


def test_promql_durations() -> None:
    assert [diagnose.promql_duration(s) for s in (60, 2, 0.5, 1.25)] == ["60s", "2s", "500ms", "1250ms"]


def test_report_lists_findings_evidence_and_remedies(monkeypatch: pytest.MonkeyPatch) -> None:
    diagnosis = run(5, serving=lambda i: {"busy": 0.2})
    out = io.StringIO()
    monkeypatch.setattr("rich.console.Console", lambda **kw: Console(file=out, width=120, **kw))
    diagnose.render(diagnosis, "heading")
    text = out.getvalue()
    assert "WARNING  host-bound  model m on node:8797" in text
    assert "busy ratio while requests run (mean): 20%" in text
    assert "avg by (job, instance, model) (llm_gpu_busy_ratio)" in text
    assert "reference/002 §4.1" in text
    assert "not assessed: throttling" in text
    assert text.rstrip().endswith("1 warning")


def test_report_of_a_healthy_history_ends_with_nothing_alarming(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr("rich.console.Console", lambda **kw: Console(file=out, width=120, **kw))
    diagnose.render(run(8, serving=lambda i: {}), "heading")
    text = out.getvalue()
    assert "WARNING" not in text
    assert "no findings: host-bound, fluctuation, oom-risk, leak" in text
    assert text.rstrip().endswith("Nothing alarming.")


def test_endpoints_without_inferwatch_series_leave_nothing_to_judge(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with http_server(200, b"# TYPE up gauge\nup 1\n") as url:
        code, out, _ = cli(capsys, "--endpoint", url, "--samples", "2", "--interval", "0.1")
    assert code == 3
    assert "No data to judge" in out and "Nothing alarming" not in out


def test_json_shape() -> None:
    report = run(5, serving=lambda i: {"busy": 0.2}).to_dict()
    assert report["alarming"] is True
    (finding,) = report["findings"]
    assert finding["check"] == "host-bound" and finding["severity"] == "warning"
    assert set(finding["evidence"][0]) == {"what", "value", "query"}
    assert set(finding["checklist"][0]) == {"action", "rationale", "source"}
    json.dumps(report)  # serializable as is


HOST_BOUND_EXPOSITION = b"""\
# TYPE llm_gpu_busy_ratio gauge
llm_gpu_busy_ratio{model="m",device="cuda:0"} 0.2
# TYPE llm_requests_running gauge
llm_requests_running{model="m"} 1
"""


def test_the_thresholds_are_the_alert_configurations(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scrape = ("--samples", "2", "--interval", "0.1")
    mine = tmp_path / "mine.yaml"
    mine.write_text("alerts:\n  InferwatchHostBound:\n    busy_ratio_below: 0.1\n")
    with http_server(200, HOST_BOUND_EXPOSITION) as url:
        default_code, default_out, _ = cli(capsys, "--endpoint", url, *scrape)
        code, out, _ = cli(capsys, "--endpoint", url, *scrape, "--alerts-config", str(mine))
    assert default_code == 1 and "WARNING  host-bound" in default_out
    assert code == 0 and "no findings: host-bound" in out


def test_a_bad_alert_configuration_exits_2_naming_the_key(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mine = tmp_path / "mine.yaml"
    mine.write_text("alerts:\n  InferwatchHostBound:\n    busy_ratio_below: 2\n")
    code, out, err = cli(capsys, "--endpoint", "http://127.0.0.1:9", "--alerts-config", str(mine))
    assert code == 2 and out == ""
    assert "'alerts.InferwatchHostBound.busy_ratio_below' is a ratio" in err
    code, _, err = cli(capsys, "--endpoint", "http://127.0.0.1:9", "--alerts-config", str(tmp_path / "none"))
    assert code == 2 and "cannot read" in err


def test_unreachable_prometheus_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    code, out, err = cli(capsys, "--prometheus", url, "--timeout", "2")
    assert code == 3 and out == ""
    assert f"Prometheus at {url} is not reachable: connection failed: Connection refused" in err


def test_something_that_is_not_prometheus_exits_3(capsys: pytest.CaptureFixture[str]) -> None:
    with http_server(404, b"not here") as url:
        code, _, err = cli(capsys, "--prometheus", url.removesuffix("/metrics"))
    assert code == 3
    assert "is not a Prometheus server" in err


def test_unreachable_endpoints_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    code, out, err = cli(capsys, "--endpoint", url, "--samples", "2", "--interval", "0.1")
    assert code == 3 and out == ""
    assert f"{url} is down: connection failed: Connection refused" in err
    assert "no endpoint could be scraped" in err


@pytest.mark.parametrize(
    "argv",
    [
        [],  # a source is required
        ["--prometheus", "http://x", "--endpoint", "http://y"],
        ["--endpoint", "http://y", "--samples", "1"],
        ["--endpoint", "http://y", "--interval", "0"],
        ["--prometheus", "http://x", "--window", "1m", "--step", "2m"],
        ["--prometheus", "http://x", "--window", "soon"],
    ],
)
def test_bad_options_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    code, _, err = cli(capsys, *argv)
    assert code == 2
    assert err
