"""The background poller: collects every interval into an immutable snapshot that scrapes read.

Each collection reads every GPU on a daemon thread of its own and waits for all of them. A GPU is hung
when one of its NVML calls has run for ``--collector.timeout`` without returning: the poll stops waiting
for it, it is served as down (its series left out, ``gpu_up`` 0, its
``..._gpu_last_collect_timestamp_seconds`` no longer advancing), and the call is counted once as
``error="hung"``. The time is measured on the call itself, from when the thread entered it: a thread
that waits for the CPU before it starts or between two calls (a busy machine, a flood of scrapes) makes
the poll late, never the GPU hung. While that thread stays stuck, later collections do not start another
for the GPU, not even across a driver reset (jobs are kept by GPU UUID, not by NVML session); the other
GPUs and the host are collected as usual. A watchdog thread counts a collection that runs past the
interval while it runs.

NVML unavailable (no driver, no library): the poller serves host metrics with ``inferwatch_nvml_up 0``
and retries initialising every ``--nvml.retry-interval``. NVML failing later (driver reset): the session
is closed and reopened at the next poll. Counters are served as NVML counts them, since the driver
loaded: a driver reset is a counter reset, which Prometheus' ``rate()`` and ``increase()`` absorb, and
a restart of the exporter changes no value (an offset kept in memory to hide the reset would be lost by
a restart, and Prometheus would count what it covered twice; docs/exporter.md, "Counters").

Every time is read on the poller's clock (:mod:`.clock`; the system's unless a test passes a manual
one): the interval, call deadlines, the NVML retry, GPM windows, durations and timestamps.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from types import ModuleType
from typing import TypeVar

from inferwatch.common.clock import SYSTEM_CLOCK, Clock
from inferwatch.common.lograte import RateLimit

from .collectors import (
    GpuCollector,
    HostCollector,
    HostContext,
    Shared,
    gpu_collectors,
    host_collectors,
)
from .config import ExporterConfig
from .nvml import HUNG, GpuContext, GpuDevice, GpuLost, NvmlGone, NvmlSession
from .samples import Sample
from .selfmetrics import (
    BUILD_INFO,
    COLLECT_DURATION,
    COLLECTOR_DURATION,
    COLLECTOR_ERRORS,
    COLLECTOR_SUCCESS,
    GPU_COLLECT_DURATION,
    GPU_LAST_COLLECT,
    GPU_UP,
    LAST_COLLECT,
    NVML_ERRORS,
    NVML_UP,
    OVERRUNS,
    Tally,
)
from .xid import XidEvents, XidWatcher

log = logging.getLogger(__name__)
log.addFilter(RateLimit())

#: How long stopping waits for a collection in progress before leaving it to the exiting process.
STOP_WAIT_SECONDS = 0.25
#: The ``collector`` label under which a collection that failed as a whole is counted.
POLLER = "poller"

Context = TypeVar("Context", GpuContext, HostContext)


@dataclass(frozen=True)
class Snapshot:
    """What one collection found; never changed after it is published."""

    samples: tuple[Sample, ...] = ()
    sequence: int = 0  # counts collections: a new number means new samples


class Outcome(Enum):
    RUNNING = "running"
    OK = "ok"
    LOST = "lost"
    NVML_GONE = "nvml_gone"


def run_collectors(
    collectors: Sequence[GpuCollector] | Sequence[HostCollector],
    context: Context,
    durations: dict[str, float],
    failures: list[tuple[str, BaseException]],
) -> None:
    """Run each collector; one that raises loses what it emitted and is recorded in ``failures``.

    GpuLost and NvmlGone are not failures of a collector: they end the whole GPU's collection.
    """
    for collector in collectors:
        mark = len(context.samples)
        started = context.clock.monotonic()
        try:
            collector.collect(context)  # type: ignore[arg-type]
        except (GpuLost, NvmlGone):
            raise
        except Exception as exc:
            del context.samples[mark:]
            failures.append((collector.name, exc))
        finally:
            durations[collector.name] += context.clock.monotonic() - started


class GpuJob:
    """One collection of one GPU, on its own daemon thread (a hung NVML call holds only this thread)."""

    def __init__(self, context: GpuContext, collectors: Sequence[GpuCollector]) -> None:
        self.context = context
        self.outcome = Outcome.RUNNING
        self.reason = ""
        self.durations: dict[str, float] = defaultdict(float)
        self.failures: list[tuple[str, BaseException]] = []
        self.elapsed = 0.0
        self.hang_reported = False
        self._started = 0.0
        self._collectors = collectors
        self._thread = threading.Thread(target=self._run, name=f"gpu{context.index}", daemon=True)

    def start(self) -> None:
        self._started = self.context.clock.monotonic()
        self._thread.start()

    def wait(self, call_timeout: float) -> bool:
        """Wait for the job to end: True when it has, False once one of its NVML calls has been running for
        ``call_timeout`` seconds (hung). Waiting for the CPU, before the first call or between calls, is
        not held against the GPU."""
        while self._thread.is_alive():
            current = self.context.current
            if current is None:  # not started yet, or between two calls: it is making progress
                self._thread.join(call_timeout)
                continue
            remaining = current[1] + call_timeout - self.context.clock.monotonic()
            if remaining <= 0:
                return not self._thread.is_alive()
            self._thread.join(remaining)
        return True

    def _run(self) -> None:
        try:
            run_collectors(self._collectors, self.context, self.durations, self.failures)
            self.outcome = Outcome.OK
        except GpuLost as exc:
            self.reason, self.outcome = str(exc), Outcome.LOST
        except NvmlGone as exc:
            self.reason, self.outcome = str(exc), Outcome.NVML_GONE
        finally:
            # From when the poller started waiting: a thread that started late on a busy machine was late.
            self.elapsed = self.context.clock.monotonic() - self._started


class Poller:
    """Owns collection: the NVML session, the GPU jobs, the host collectors, and the latest snapshot."""

    def __init__(
        self, config: ExporterConfig, nvml: ModuleType | None, version: str = "", clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._config = config
        self._clock = clock
        self._nvml = nvml
        self._version = version
        # What collectors share: the serving processes, and what the Kubernetes ones share, with the thread
        # that lists the kubelet's pod resources.
        shared = Shared.from_config(config)
        self.pods = shared.pods
        self._gpu_collectors = gpu_collectors(config, shared)
        self._host_collectors = host_collectors(config, shared)
        self.nvml_errors = Tally(NVML_ERRORS)
        names = [c.name for c in (*self._gpu_collectors, *self._host_collectors)] + [POLLER]
        self.collector_errors = Tally(COLLECTOR_ERRORS, preset=[(name,) for name in names])
        self.overruns = Tally(OVERRUNS, preset=[()])
        self.xid_events = XidEvents(config.state_dir or None)
        self.snapshot = Snapshot()
        self.ready = threading.Event()

        self._session: NvmlSession | None = None
        self._xid_watcher: XidWatcher | None = None
        self._next_init = 0.0
        self._nvml_down_logged = False
        # By GPU UUID, not by device: a reinitialised session must not start a second thread for a GPU
        # whose previous one is still stuck in NVML.
        self._jobs: dict[str, GpuJob] = {}
        # By GPU labels rather than device, so that they carry over a reinitialisation.
        self._last_read: dict[tuple[str, str], tuple[float, float]] = {}  # -> (finished at, elapsed)
        self._down: set[tuple[str, str]] = set()
        self._failures_logged: set[str] = set()

        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._collection_lock = threading.Lock()
        self._collection_started: float | None = None  # monotonic; None between collections
        self._overrun_counted = False

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> None:
        self._loop_thread = threading.Thread(target=self._loop, name="poller", daemon=True)
        self._loop_thread.start()
        threading.Thread(target=self._watchdog, name="watchdog", daemon=True).start()
        if self.pods is not None:
            self.pods.watcher.start()

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> None:
        """Stop polling: give the running collection ``wait`` seconds to end, then shut NVML down unless a
        collection or a GPU thread is still inside it (the process is about to exit and frees it)."""
        self._stop.set()
        if self.pods is not None:
            self.pods.watcher.stop()
        if self._loop_thread is not None:
            self._loop_thread.join(wait)
            if self._loop_thread.is_alive():
                return
        if self._session is not None:
            self._close_session()

    def samples(self) -> Iterator[Sample]:
        """The latest snapshot and the live counts: what a scrape renders. Never blocks on collection."""
        yield from self.snapshot.samples
        yield from self.overruns.samples()
        yield from self.nvml_errors.samples()
        yield from self.collector_errors.samples()
        if self._config.enabled("xid"):
            yield from self.xid_events.samples()
        if self.pods is not None:
            yield from self.pods.watcher.samples()

    def state(self) -> tuple[object, ...]:
        """Changes whenever :meth:`samples` would yield something else (compare with ``==``)."""
        tallies = (self.overruns, self.nvml_errors, self.collector_errors)
        watcher = self.pods.watcher.version if self.pods is not None else 0
        return (self.snapshot.sequence, *(t.version for t in tallies), self.xid_events.version, watcher)

    def _loop(self) -> None:
        due = self._clock.monotonic()
        while not self._stop.is_set():
            try:
                self.collect()
            except Exception:  # a bug must cost one collection, not every later one
                self.collector_errors.add(POLLER)
                log.exception("collection failed; trying again at the next interval")
            due += self._config.interval
            now = self._clock.monotonic()
            due = max(due, now)  # after an overrun, start again at once rather than catch up in a burst
            self._stop.wait(due - now)

    def _watchdog(self) -> None:
        period = min(self._config.interval / 4, 0.25)
        while not self._stop.wait(period):
            with self._collection_lock:
                started = self._collection_started
                if started is None or self._overrun_counted:
                    continue
                running = self._clock.monotonic() - started
                if running <= self._config.interval:
                    continue
                self._overrun_counted = True
            self.overruns.add()
            log.warning(
                "collection has run for %.2fs, longer than the %.2fs interval", running, self._config.interval
            )

    # --- one collection --------------------------------------------------------------------------------

    def collect(self) -> Snapshot:
        """Run one collection now and publish its snapshot."""
        started = self._clock.monotonic()
        with self._collection_lock:
            self._collection_started, self._overrun_counted = started, False
        samples: list[Sample] = [Sample(BUILD_INFO, (self._version,), 1.0)]
        durations: dict[str, float] = defaultdict(float)
        failures: list[tuple[str, BaseException]] = []

        session = self._open_session()
        samples.append(Sample(NVML_UP, (), 1.0 if session is not None else 0.0))
        gpu_pids: dict[int, set[str]] = {}
        if session is not None:
            samples += self._collect_gpus(session, durations, failures, gpu_pids)
        host = HostContext(gpu_pids, self._clock)
        run_collectors(self._host_collectors, host, durations, failures)
        samples += host.samples

        for name, exc in failures:
            self.collector_errors.add(name)
            self._log_failure(name, exc)
        samples += [Sample(COLLECTOR_DURATION, (name,), seconds) for name, seconds in durations.items()]
        failed = {name for name, _ in failures}
        samples += [Sample(COLLECTOR_SUCCESS, (name,), float(name not in failed)) for name in durations]
        finished_at = self._clock.time()
        elapsed = self._clock.monotonic() - started
        samples.append(Sample(COLLECT_DURATION, (), elapsed))
        samples.append(Sample(LAST_COLLECT, (), finished_at))

        with self._collection_lock:
            self._collection_started = None
            overran = elapsed > self._config.interval and not self._overrun_counted
        if overran:
            self.overruns.add()
        self.snapshot = Snapshot(tuple(samples), self.snapshot.sequence + 1)
        self.ready.set()
        return self.snapshot

    def _collect_gpus(
        self,
        session: NvmlSession,
        durations: dict[str, float],
        failures: list[tuple[str, BaseException]],
        gpu_pids: dict[int, set[str]],
    ) -> list[Sample]:
        started: dict[GpuDevice, GpuJob] = {}
        for device in session.devices:
            previous = self._jobs.get(device.uuid)
            if previous is not None and previous.outcome is Outcome.RUNNING:
                continue  # still stuck in an NVML call: do not stack another thread on it
            if previous is not None and previous.hang_reported:
                log.info("GPU %d: the hung NVML call returned after %.1fs", device.index, previous.elapsed)
            job = GpuJob(
                GpuContext(session.nvml, device, self.nvml_errors, self._clock), self._gpu_collectors
            )
            job.start()
            self._jobs[device.uuid] = started[device] = job

        samples: list[Sample] = []
        nvml_gone = ""
        for device in session.devices:
            job = self._jobs[device.uuid]
            finished = job.wait(self._config.timeout) if device in started else False
            up = finished and job.outcome is Outcome.OK
            if up:
                samples += job.context.samples
                for pid in job.context.process_ids:
                    gpu_pids.setdefault(pid, set()).add(device.uuid)
                self._last_read[device.labels] = (self._clock.time(), job.elapsed)
                for name, seconds in job.durations.items():
                    durations[name] += seconds
                failures += job.failures
            elif not finished:
                self._report_hang(device, job)
            elif job.outcome is Outcome.NVML_GONE:
                nvml_gone = job.reason
            self._note_up(device, up, job)
            samples.append(Sample(GPU_UP, device.labels, 1.0 if up else 0.0))
            if device.labels in self._last_read:
                finished_at, elapsed = self._last_read[device.labels]
                samples.append(Sample(GPU_LAST_COLLECT, device.labels, finished_at))
                samples.append(Sample(GPU_COLLECT_DURATION, device.labels, elapsed))
        if nvml_gone:
            log.warning("NVML stopped working (%s); reinitialising", nvml_gone)
            self._close_session()
            self._next_init = 0.0
        return samples

    def _report_hang(self, device: GpuDevice, job: GpuJob) -> None:
        if job.hang_reported:
            return
        job.hang_reported = True
        current = job.context.current
        call = current[0] if current is not None else "unknown"
        self.nvml_errors.add(call, HUNG)
        log.warning(
            "GPU %d (%s): %s has not returned within %.2fs; serving the GPU as down until it does",
            device.index,
            device.uuid,
            call,
            self._config.timeout,
        )

    def _note_up(self, device: GpuDevice, up: bool, job: GpuJob) -> None:
        """Log each GPU's transitions between up and down once, not every poll."""
        if up and device.labels in self._down:
            self._down.discard(device.labels)
            log.info("GPU %d (%s) is back", device.index, device.uuid)
        elif not up and device.labels not in self._down:
            self._down.add(device.labels)
            if job.outcome is Outcome.LOST:
                log.warning("GPU %d (%s) is lost: %s", device.index, device.uuid, job.reason)

    def _log_failure(self, name: str, exc: BaseException) -> None:
        if name in self._failures_logged:
            log.debug("collector %s failed: %r", name, exc)
            return
        self._failures_logged.add(name)
        log.error("collector %s failed; its series are left out: %r", name, exc, exc_info=exc)

    # --- the NVML session ------------------------------------------------------------------------------

    def _open_session(self) -> NvmlSession | None:
        if self._session is not None or self._nvml is None:
            return self._session
        now = self._clock.monotonic()
        if now < self._next_init:
            return None
        self._next_init = now + self._config.nvml_retry_interval
        try:
            session = NvmlSession.open(self._nvml, self._config.gpus)
        except Exception as exc:  # any failure to initialise means the same: no NVML for now
            level = logging.DEBUG if self._nvml_down_logged else logging.WARNING
            self._nvml_down_logged = True
            log.log(
                level,
                "NVML unavailable (%s); serving host metrics with inferwatch_nvml_up 0, retrying every %gs",
                exc,
                self._config.nvml_retry_interval,
            )
            return None
        self._nvml_down_logged = False
        log.info(
            "NVML initialised: driver %s, exporting %d GPU(s)",
            session.driver_version or "?",
            len(session.devices),
        )
        self._session = session
        self._jobs = {d: j for d, j in self._jobs.items() if j.outcome is Outcome.RUNNING}
        if self._config.enabled("xid"):
            self._xid_watcher = XidWatcher(session, self.xid_events, self.nvml_errors)
            self._xid_watcher.start()
        return session

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if self._xid_watcher is not None:
            self._xid_watcher.stop()
            self._xid_watcher = None
        if session is None:
            return
        # A stuck job may belong to an earlier session (jobs are kept by UUID): its device still counts.
        stuck = {job.context.device for job in self._jobs.values() if job.outcome is Outcome.RUNNING}
        session.close(busy=stuck)
