"""Helpers shared by the test suites: ports, waiting on HTTP, parsing exposition text and docs/metrics.md.

Its modules serve every tier (unit, integration, gpu): :mod:`.services` starts real services (Prometheus,
Alertmanager, the demo, the exporter) and :mod:`.processes` runs the ``inferwatch`` command as a process;
tests import helpers from here, never from another tier's test modules.
"""

from __future__ import annotations

import re
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[2]
# The package's own tree (src layout): its generated rules and dashboards are committed there.
PACKAGE_ROOT = REPO_ROOT / "src" / "inferwatch"
METRICS_DOC = REPO_ROOT / "docs" / "metrics.md"


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """Status and body of a GET; HTTP errors are returned, not raised."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def wait_for_http(url: str, timeout: float = 30.0) -> str:
    """Poll ``url`` until it answers 200; return the body. Raises TimeoutError with the last failure."""
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            status, body = http_get(url, timeout=2.0)
            if status == 200:
                return body
            last = f"HTTP {status}"
        except OSError as exc:
            last = exc
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer 200 within {timeout}s (last: {last})")


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse_samples(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition."""
    return [
        Sample(s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """Sum of the samples named ``name`` whose labels include ``labels``; None when there is none."""
    found = [s.value for s in parse_samples(text) if s.name == name and labels.items() <= s.labels.items()]
    return sum(found) if found else None


def exposed_metrics(text: str) -> dict[str, str]:
    """Metric name -> type as a user reads them: counters carry ``_total``, like in docs/metrics.md."""
    out = {}
    for family in text_string_to_metric_families(text):
        name = family.name + "_total" if family.type == "counter" else family.name
        out[name] = family.type
    return out


_DOC_ROW = re.compile(r"^\|\s*`(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)`\s*\|\s*(?P<type>[a-z]+)\s*\|")


def documented_metrics(section_prefix: str) -> dict[str, str]:
    """Metric name -> type from the tables of docs/metrics.md sections whose ``##`` heading starts with
    ``section_prefix``."""
    out: dict[str, str] = {}
    in_section = False
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            in_section = line[3:].startswith(section_prefix)
            continue
        match = _DOC_ROW.match(line)
        if in_section and match:
            out[match["name"]] = match["type"]
    return out
