"""XID errors: a thread blocked on NVML's event set, counting each XID as it is delivered.

dcgm-exporter's ``DCGM_FI_DEV_XID_ERRORS`` is a gauge holding the last XID code, which stays set until
another arrives: it cannot say how many happened, and an alert on it fires forever. Here each XID code
is a counter per GPU (``increase(gpu_xid_errors_total[10m])`` counts them) with the time of the last
occurrence beside it. Counts live in :class:`XidEvents`, which outlives NVML sessions; a
:class:`XidWatcher` belongs to one session and is replaced when NVML is reinitialised.

Prometheus counts only what it sees rise, so two things keep every XID visible as a rise:

* **born at zero**: every watched GPU shows the codes of :data:`CRITICAL_XIDS` at 0 from the moment it is
  registered, so the first XID of such a code is a step from 0 to 1 (a series born at 1 is a rise that
  ``increase()`` cannot see);
* **counted across restarts**: with a state directory (``--state.dir``), counts and last times are kept in
  a file written at every XID and read at start, so a counter goes on from where the previous life of the
  exporter left it: the same code after a restart is a step from N to N+1, not a series that comes back
  at 1 (docs/alerts.md, "XIDs across exporter restarts").
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from inferwatch.common.lograte import RateLimit

from .nvml import ERROR_TIMEOUT, NVML_GONE_CODES, NvmlSession, error_label, handle_key
from .samples import FamilySpec, Sample, gpu_counter, gpu_gauge
from .selfmetrics import Tally

log = logging.getLogger(__name__)
# Every XID is counted; the log shows a few of each kind a minute (a failing GPU can send thousands).
log.addFilter(RateLimit())

XID_ERRORS = gpu_counter("gpu_xid_errors_total", "XID errors reported by the driver, by XID code.", "xid")
XID_LAST = gpu_gauge(
    "gpu_xid_last_timestamp_seconds", "Unix time of the last XID error with this code.", "xid"
)
XID_WATCHED = FamilySpec(
    "inferwatch_exporter_xid_watched_gpus", "gauge", "GPUs registered for XID events (0: none are watched)."
)

#: XIDs that mean a hardware, driver or firmware fault rather than an application's own error (NVIDIA's XID
#: catalogue: ECC, row remapping, GSP, NVLink, fallen off the bus): shown at 0 on every watched GPU before
#: they happen. The default of the InferwatchGpuXidError alert's ``xids`` (alerts/config.yaml) is this set.
CRITICAL_XIDS = (48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140)
#: The file in the state directory that holds the counts across restarts.
STATE_FILE = "xid-errors.json"

_XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
_WAIT_MS = 500  # bounds how long stopping a watcher takes


class XidEvents:
    """XID counts and last times by GPU and code; thread-safe, exported live, kept in ``state_dir`` (when
    given) across restarts of the exporter."""

    def __init__(self, state_dir: str | os.PathLike[str] | None = None) -> None:
        self._lock = threading.Lock()
        self._events: dict[tuple[str, ...], tuple[int, float]] = {}  # (gpu, uuid, xid) -> (count, last)
        self._gpus: set[tuple[str, str]] = set()  # every GPU registered so far: its critical codes show 0
        self._watched = 0
        self._state = Path(state_dir, STATE_FILE) if state_dir else None
        self.version = 0  # changes with every event, so that a cached exposition knows it is stale
        if self._state is not None:
            self._events = _load(self._state)

    @property
    def watched(self) -> int:
        return self._watched

    def watch(self, gpus: Iterable[tuple[str, str]]) -> None:
        """``gpus`` (their labels) are registered for XID events now; none are when it is empty."""
        gpus = list(gpus)
        with self._lock:
            self._watched = len(gpus)
            self._gpus.update(gpus)
            self.version += 1

    def record(self, gpu_labels: tuple[str, str], xid: int, when: float) -> None:
        key = (*gpu_labels, str(xid))
        with self._lock:
            count, _ = self._events.get(key, (0, 0.0))
            self._events[key] = (count + 1, when)
            self.version += 1
            if self._state is not None:
                _save(self._state, self._events)  # under the lock: files are written in the counts' order

    def samples(self) -> Iterator[Sample]:
        with self._lock:
            events = dict(self._events)
            gpus = sorted(self._gpus)
        for gpu in gpus:
            for code in CRITICAL_XIDS:
                events.setdefault((*gpu, str(code)), (0, 0.0))
        yield Sample(XID_WATCHED, (), float(self.watched))
        for labels, (count, _) in events.items():
            yield Sample(XID_ERRORS, labels, float(count))
        for labels, (count, last) in events.items():
            if count:  # a code that never happened has no last time
                yield Sample(XID_LAST, labels, last)


def _load(path: Path) -> dict[tuple[str, ...], tuple[int, float]]:
    """The counts a previous life of the exporter kept in ``path``; none (logged) when it cannot be read."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        events = {
            (str(gpu), str(uuid), str(xid)): (int(count), float(last))
            for gpu, uuid, xid, count, last in document["events"]
        }
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("XID counts start from zero: %s cannot be read: %s", path, exc)
        return {}
    log.info("XID counts of %d GPU/code pair(s) carried over from %s", len(events), path)
    return events


def _save(path: Path, events: dict[tuple[str, ...], tuple[int, float]]) -> None:
    """Write the counts to ``path`` whole or not at all (a temporary file renamed over it): an exporter
    killed while writing leaves the previous counts, never half a file. A failure is logged, not raised:
    the XID is counted in memory all the same."""
    rows = [[*key, count, last] for key, (count, last) in events.items()]
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"events": rows}), encoding="utf-8")
        os.replace(temporary, path)
    except OSError as exc:
        log.warning("XID counts not kept across restarts: cannot write %s: %s", path, exc)


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
            self._events.watch(device.labels for device in devices.values())
            if devices:
                self._wait_for_events(event_set, devices)
        finally:
            self._events.watch(())
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
