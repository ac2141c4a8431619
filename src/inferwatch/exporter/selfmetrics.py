"""The exporter's metrics about itself: collection health, NVML errors, staleness, web config reloads.

Error and overrun counts are kept in :class:`Tally` objects that GPU worker threads, the XID thread and
the watchdog update directly, and ``/metrics`` reads them live: a stuck collection cannot hide the count
that reports it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator

from .samples import FamilySpec, Sample, gpu_gauge

NVML_UP = FamilySpec("inferwatch_nvml_up", "gauge", "1 when the NVML library is initialised, else 0.")
GPU_UP = gpu_gauge(
    "gpu_up",
    "1 when the last collection read this GPU; 0 when it is lost, hung or NVML failed on it.",
)
BUILD_INFO = FamilySpec(
    "inferwatch_exporter_build_info", "gauge", "Version of the running exporter; always 1.", ("version",)
)
LAST_COLLECT = FamilySpec(
    "inferwatch_exporter_last_collect_timestamp_seconds",
    "gauge",
    "Unix time the last collection finished; its age is the staleness of every series.",
)
COLLECT_DURATION = FamilySpec(
    "inferwatch_exporter_collect_duration_seconds", "gauge", "Wall time of the last collection."
)
COLLECTOR_SUCCESS = FamilySpec(
    "inferwatch_exporter_collector_success",
    "gauge",
    "1 when the collector ran without failing in the last collection (on every GPU it read), else 0.",
    ("collector",),
)
COLLECTOR_DURATION = FamilySpec(
    "inferwatch_exporter_collector_duration_seconds",
    "gauge",
    "Time one collector took in the last collection, summed over GPUs.",
    ("collector",),
)
GPU_LAST_COLLECT = gpu_gauge(
    "inferwatch_exporter_gpu_last_collect_timestamp_seconds",
    "Unix time this GPU was last read completely; stays behind while it is hung or lost.",
)
GPU_COLLECT_DURATION = gpu_gauge(
    "inferwatch_exporter_gpu_collect_duration_seconds",
    "Wall time of the last complete read of this GPU (one poll of every NVML collector).",
)
OVERRUNS = FamilySpec(
    "inferwatch_exporter_collection_overruns_total",
    "counter",
    "Collections still running when the next was due (reported by the watchdog as it happens).",
)
NVML_ERRORS = FamilySpec(
    "inferwatch_exporter_nvml_errors_total",
    "counter",
    "Failed NVML calls by function and error; not_supported is counted once per GPU, then not retried.",
    ("call", "error"),
)
COLLECTOR_ERRORS = FamilySpec(
    "inferwatch_exporter_collector_errors_total",
    "counter",
    "Failures of a collector other than NVML errors (per GPU for NVML collectors); its series were left out.",
    ("collector",),
)


class Tally:
    """Thread-safe event counts by label values, exported as one counter family.

    ``preset`` label sets are exported from the start at 0, so that ``increase()`` sees the first event.
    """

    def __init__(self, spec: FamilySpec, preset: Iterable[tuple[str, ...]] = ()) -> None:
        self._spec = spec
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, ...], int] = dict.fromkeys(preset, 0)
        self.version = 0  # changes with every count, so that a cached exposition knows it is stale

    def add(self, *labels: str) -> None:
        with self._lock:
            self._counts[labels] = self._counts.get(labels, 0) + 1
            self.version += 1

    def get(self, *labels: str) -> int:
        with self._lock:
            return self._counts.get(labels, 0)

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            counts = list(self._counts.items())
        for labels, count in counts:
            yield Sample(self._spec, labels, float(count))


RELOAD_OK = FamilySpec(
    "inferwatch_exporter_web_config_last_reload_successful",
    "gauge",
    "1 when the last SIGHUP reload of the web config file was applied (or none came yet), 0 if refused.",
)
RELOAD_OK_AT = FamilySpec(
    "inferwatch_exporter_web_config_last_reload_success_timestamp_seconds",
    "gauge",
    "Unix time the web config in use was loaded (at start-up or by a SIGHUP reload).",
)


class ReloadStatus:
    """Whether the last reload of the web config file was applied, and when the one in use was loaded;
    updated by the reloading task, read by scrapes (the same interface as :class:`Tally`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ok = True
        self._loaded_at = time.time()
        self.version = 0

    def record(self, ok: bool) -> None:
        with self._lock:
            self._ok = ok
            if ok:
                self._loaded_at = time.time()
            self.version += 1

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            ok, loaded_at = self._ok, self._loaded_at
        yield Sample(RELOAD_OK, (), 1.0 if ok else 0.0)
        yield Sample(RELOAD_OK_AT, (), loaded_at)
