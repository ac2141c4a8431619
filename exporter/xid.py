"""XID errors: a thread blocked on NVML's event set, counting each XID as it is delivered.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the last XID code, which stays set until
another arrives: it cannot say how many happened, and an alert on it fires forever. Here each XID code
is a counter per GPU (``increase(gpu_xid_errors_total[10m]) > 0`` means "an XID happened recently") with
the time of the last occurrence beside it. Counts live in :class:`XidEvents`, which outlives NVML
sessions; a :class:`XidWatcher` belongs to one session and is replaced when NVML is reinitialised.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator

from inferwatch.common.lograte import RateLimit

from .nvml import ERROR_TIMEOUT, NVML_GONE_CODES, NvmlSession, error_label, handle_key
from .samples import MetricSpec, Sample, gpu_counter, gpu_gauge
from .selfmetrics import Tally

log = logging.getLogger(__name__)
# Every XID is counted; the log shows a few of each kind a minute (a failing GPU can send thousands).
log.addFilter(RateLimit())

XID_ERRORS = gpu_counter("gpu_xid_errors_total", "XID errors reported by the driver, by XID code.", "xid")
XID_LAST = gpu_gauge(
    "gpu_xid_last_timestamp_seconds", "Unix time of the last XID error with this code.", "xid"
)
XID_WATCHED = MetricSpec(
    "inferwatch_exporter_xid_watched_gpus", "gauge", "GPUs registered for XID events (0: none are watched)."
)

_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
_WAIT_MS = 500  # bounds how long stopping a watcher takes


class XidEvents:
    """XID counts and last times by GPU and code; thread-safe, exported live."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, ...], tuple[int, float]] = {}  # (gpu, uuid, xid) -> (count, last)
        self._watched = 0
        self.version = 0  # changes with every event, so that a cached exposition knows it is stale

    @property
    def watched(self) -> int:
        return self._watched

    @watched.setter
    def watched(self, gpus: int) -> None:
        with self._lock:
            self._watched = gpus
            self.version += 1

    def record(self, gpu_labels: tuple[str, str], xid: int, when: float) -> None:
        key = (*gpu_labels, str(xid))
        with self._lock:
            count, _ = self._events.get(key, (0, 0.0))
            self._events[key] = (count + 1, when)
            self.version += 1

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            events = list(self._events.items())
        yield Sample(XID_WATCHED, (), float(self.watched))
        for labels, (count, _) in events:
            yield Sample(XID_ERRORS, labels, float(count))
        for labels, (_, last) in events:
            yield Sample(XID_LAST, labels, last)


class XidWatcher:
    """Waits on one NVML session's event set for XID events, on a daemon thread of its own."""

    def __init__(self, session: NvmlSession, events: XidEvents, errors: Tally) -> None:
        self._session = session
        self._events = events
        self._errors = errors
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="xid", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Ask the thread to end; it does within one wait (0.5 s) and frees its event set itself."""
        self._stop.set()

    def _run(self) -> None:
        nvml = self._session.nvml
        try:
            event_set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as exc:
            self._errors.add("nvmlEventSetCreate", error_label(exc.value))
            log.warning("XID events unavailable: nvmlEventSetCreate failed: %s", exc)
            return
        try:
            devices = {}
            for device in self._session.devices:
                try:
                    nvml.nvmlDeviceRegisterEvents(device.handle, _XID_CRITICAL_ERROR, event_set)
                except nvml.NVMLError as exc:
                    self._errors.add("nvmlDeviceRegisterEvents", error_label(exc.value))
                    log.info("GPU %d: XID events unavailable: %s", device.index, exc)
                    continue
                devices[handle_key(device.handle)] = device
            self._events.watched = len(devices)
            if devices:
                self._wait_for_events(event_set, devices)
        finally:
            self._events.watched = 0
            try:
                nvml.nvmlEventSetFree(event_set)
            except nvml.NVMLError as exc:
                log.debug("nvmlEventSetFree failed: %s", exc)

    def _wait_for_events(self, event_set: object, devices: dict) -> None:
        nvml = self._session.nvml
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        while not self._stop.is_set():
            try:
                data = wait(event_set, _WAIT_MS)
            except nvml.NVMLError as exc:
                if exc.value == ERROR_TIMEOUT:
                    continue
                self._errors.add("nvmlEventSetWait", error_label(exc.value))
                if exc.value in NVML_GONE_CODES:
                    return  # the poller reopens NVML and starts a new watcher
                log.warning("waiting for XID events failed: %s", exc)
                self._stop.wait(1.0)  # back off rather than spin on a persistent error
                continue
            device = devices.get(handle_key(data.device))
            if not data.eventType & _XID_CRITICAL_ERROR or device is None:
                continue
            xid = int(data.eventData)
            self._events.record(device.labels, xid, time.time())
            log.warning("GPU %d (%s): XID %d", device.index, device.uuid, xid)
