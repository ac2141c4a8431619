"""How much of the wall time the GPU ran this serving process's kernels, from the driver.

The spans of a model's forward passes on its stream are no such measure: on a host-bound step the device
reaches the end mark as soon as the host has launched the last kernel, so the span is the host's launch
time (an eager 1B decode on an H200: spans covering 85-100 % of the wall time while the profiler's kernel
intervals cover 5 %). The driver knows when kernels ran. Which of its figures is this process's:

* the GPU lists exactly one compute process and the listing holds every process on the GPU (this
  process is in the host's PID namespace, or the driver lists host PIDs, under which this process is not
  found by its own): that process is this one (it holds a context on the GPU), and the GPU's own figures
  are this process's. On a GPU with GPM (Hopper and newer) that is the graphics engine's activity since
  the last poll, ``source="graphics"`` (:mod:`.gpm`); elsewhere the mean of NVML's utilization samples
  since the last poll, ``source="device"``;
* otherwise, where the GPU lists this process under its PID (its own, or one of its ``NSpid`` entries
  where ``/proc`` shows the outer namespaces): NVML's per-process utilization of this process,
  ``source="process"``. That includes a container's PID namespace, where the driver lists the
  namespace's processes only, under their PIDs there, and hides the others: the GPU's figure would count
  them. NVML answers the per-process figure as the process's share of the time since the timestamp asked
  for (measured: a 1 s-on, 1.5 s-off load read 38 % over 5 s), so each poll asks from the previous one;
* otherwise nothing is reported (several processes and none of them known as this one, none listed at
  all, neither figure supported, no NVML) and ``llm_gpu_busy_unavailable`` says why: the whole GPU's figure
  would count the neighbours' kernels, and a busy ratio that reads high hides a host-bound model.

The GPU's figures come first where they are this process's, the graphics engine's before the
utilization (the engine's counter covers exactly the time between two polls). Every source counts the
engine's time around each kernel too, so a loop of many short kernels reads above its kernel-busy share
(an H100: eager 1B decode 0.12 for 0.09, compiled 0.47 for 0.41; docs/benchmarks.md, "The GPU busy ratio,
each source against the trace").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from inferwatch.instrumentation.device.gpm import GraphicsActivity
from inferwatch.instrumentation.metrics.vocabulary import (
    NOT_SUPPORTED,
    PROCESS_AMBIGUOUS,
    PROCESS_NOT_VISIBLE,
    SOURCE_DEVICE,
    SOURCE_GRAPHICS,
    SOURCE_PROCESS,
    BusySource,
    BusyUnavailable,
)

#: The inode of the initial PID namespace (the kernel's PROC_PID_INIT_INO).
_INITIAL_PID_NAMESPACE_INODE = 0xEFFFFFFC


# nvmlSamplingType_t: NVML_GPU_UTILIZATION_SAMPLES.
_GPU_UTILIZATION_SAMPLES = 1


class BusyReading(NamedTuple):
    """The share of the last window the GPU ran this process's kernels, and where it came from."""

    ratio: float
    source: BusySource


def own_pids(status_path: str = "/proc/self/status") -> frozenset[int]:
    """This process's PIDs: its own, and every ``NSpid`` entry (one per PID namespace ``/proc`` shows)."""
    pids = {os.getpid()}
    try:
        with open(status_path, encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    pids.update(int(field) for field in line.split()[1:] if field.isdigit())
                    break
    except OSError:
        pass
    return frozenset(pids)


def in_initial_pid_namespace(path: str = "/proc/self/ns/pid") -> bool:
    """Whether this process sees the host's PIDs (False in a container's PID namespace, or unknown)."""
    try:
        return os.stat(path).st_ino == _INITIAL_PID_NAMESPACE_INODE
    except OSError:
        return False


def identify(process_pids: set[int], own: frozenset[int]) -> tuple[set[int], str | None]:
    """Which of the GPU's compute processes are this process: (their PIDs, None), or (nothing, why not).

    The only listed process is this one; among several, those listed under one of this process's PIDs."""
    if len(process_pids) == 1:
        return set(process_pids), None
    mine = process_pids & own
    if mine:
        return mine, None
    return set(), PROCESS_NOT_VISIBLE if not process_pids else PROCESS_AMBIGUOUS


class BusyMeter:
    """Reads the busy share of one GPU for this process at every poll of the NVML poller.

    Keeps the timestamps of the NVML samples it has seen, so each poll reads the samples newer than the
    previous poll's: its window is the time between two polls.
    """

    def __init__(
        self,
        nvml: Any,
        handle: Any,
        own: frozenset[int] | None = None,
        initial_namespace: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._nvml = nvml
        self._handle = handle
        #: This process's PIDs (:func:`own_pids`), and whether they are the host's.
        self.own = own_pids() if own is None else own
        self.initial_namespace = (
            in_initial_pid_namespace() if initial_namespace is None else initial_namespace
        )
        self._last_process_us = 0
        self._last_device_us = 0
        self._unsupported: set[str] = set()  # the NVML calls this GPU answered NOT_SUPPORTED
        self._device_figure: float | None = None
        self._graphics = GraphicsActivity(nvml, handle, clock)
        self._graphics_figure: float | None = None

    def read(self, process_pids: set[int]) -> BusyReading | BusyUnavailable | None:
        """The reading for a poll whose compute processes are ``process_pids``, why there is none, or None
        while the first GPM window is open (the graphics figure comes from the next poll on).

        Raises what NVML raises other than "not supported" (counted by the caller, retried next poll)."""
        pids, why = identify(process_pids, self.own)
        if why is not None:
            return why
        if len(process_pids) == 1 and self._lists_every_process(process_pids):
            graphics = self._graphics_share()
            if self._graphics.supported:
                return None if graphics is None else BusyReading(graphics, SOURCE_GRAPHICS)
            share = self._device_share()
            if share is not None:
                return BusyReading(share, SOURCE_DEVICE)
        else:
            # The GPU's figure would count other processes from here on: a later window starts afresh.
            self._graphics.restart()
            self._graphics_figure = None
        share = self._process_share(pids)
        return NOT_SUPPORTED if share is None else BusyReading(share, SOURCE_PROCESS)

    def close(self) -> None:
        """Give back what NVML holds for this meter (the GPM sample buffers)."""
        self._graphics.close()

    def _graphics_share(self) -> float | None:
        """The graphics engine's active share since the last poll; the last poll's figure where this poll
        came too soon after it for a GPM window, None before the first window closed."""
        share = self._graphics.read()
        if share is not None:
            self._graphics_figure = share
        return self._graphics_figure

    def _lists_every_process(self, process_pids: set[int]) -> bool:
        """Whether a listing can be taken to hold every process on the GPU. In a PID namespace the driver
        lists only the namespace's processes, under their PIDs there (measured on the H200: a process in
        its own namespace was listed alone, as PID 1, beside a busy one outside), so the GPU's figure
        would count processes this one cannot see; a listing under host PIDs, as the initial namespace
        or a driver that does not translate PIDs gives, holds them all."""
        return self.initial_namespace or not process_pids & self.own

    def _samples(self, call: str, *args: Any) -> Any:
        """``nvml.call(handle, *args)``; ``[]`` where there is no sample newer than asked for, None where
        the GPU does not support the call (not asked again)."""
        if call in self._unsupported:
            return None
        nvml = self._nvml
        try:
            return getattr(nvml, call)(self._handle, *args)
        except Exception as exc:
            error = getattr(exc, "value", None)
            if error == getattr(nvml, "NVML_ERROR_NOT_SUPPORTED", object()):
                self._unsupported.add(call)
                return None
            # NOT_FOUND: no sample newer than the timestamp; pynvml raises one carrying SUCCESS when the
            # driver's buffer is empty.
            if error in (getattr(nvml, "NVML_ERROR_NOT_FOUND", object()), getattr(nvml, "NVML_SUCCESS", 0)):
                return []
            raise

    def _device_share(self) -> float | None:
        """Mean of the GPU's utilization samples (one every 200 ms on an H200) since the last poll; the last
        poll's figure while none is new, None where the GPU keeps none."""
        answer = self._samples("nvmlDeviceGetSamples", _GPU_UTILIZATION_SAMPLES, self._last_device_us)
        if answer is None:
            return None
        value_type, samples = answer or (0, [])
        fresh = [s for s in samples if s.timeStamp > self._last_device_us]
        if fresh:
            self._last_device_us = max(s.timeStamp for s in fresh)
            self._device_figure = (
                sum(_sample_value(value_type, s.sampleValue) for s in fresh) / len(fresh) / 100
            )
        return self._device_figure

    def _process_share(self, pids: set[int]) -> float | None:
        """The share of the time since the last poll that kernels of ``pids`` ran; None where the driver
        cannot tell processes apart."""
        samples = self._samples("nvmlDeviceGetProcessUtilization", self._last_process_us)
        if samples is None:
            return None
        # One sample per process, its share since the timestamp asked for; the latest where there are more.
        # Each process's sample has its own timestamp (a busy neighbour's is often the later): the next
        # poll asks from this process's, or it would filter its own newer share out.
        latest: dict[int, Any] = {}
        for sample in samples:
            if sample.pid in pids and sample.timeStamp > getattr(latest.get(sample.pid), "timeStamp", 0):
                latest[sample.pid] = sample
        mine = [s for s in latest.values() if s.timeStamp > self._last_process_us]
        if not mine:
            return 0.0  # no sample since the last poll: no kernel of this process ran
        self._last_process_us = max(s.timeStamp for s in mine)
        return min(1.0, sum(s.smUtil for s in mine) / 100)


def _sample_value(value_type: int, value: Any) -> float:
    """The number inside an ``nvmlValue_t`` union (value types 0..4: double, uint, ulong, ulonglong,
    slonglong): the exporter's ``union_value``, which the instrumentation may not import."""
    member = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal")[value_type]
    return float(getattr(value, member))
