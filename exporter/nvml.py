"""The NVML seam: loading the binding, opening a session, and reading one GPU with every failure contained.

The binding is any module with pynvml's interface (functions named like the C API, ``NVMLError`` with a
``.value`` return code). It is ``pynvml`` (the ``nvidia-ml-py`` distribution) unless the environment
variable ``INFERWATCH_EXPORTER_NVML_MODULE`` names another; the test suite uses that to load a
fault-injecting stand-in into a real exporter process. Nothing here imports torch or CUDA.

Error policy, per call (see :meth:`GpuContext.read`):

* not supported (or the function is missing from the driver or binding): the series is left out, the
  error counted once, and the call is not made again on that GPU for the life of the session;
* GPU lost: the rest of that GPU's collection is abandoned and ``gpu_up`` is 0 for it;
* NVML itself gone (uninitialised, driver unloaded, version mismatch): the session is closed and reopened;
* anything else: that series is left out this time and the error counted.

GPM (GPU Performance Monitoring, Hopper and newer) reads profiling counters into sample buffers that NVML
allocates; each GPU keeps its buffers in :attr:`GpuDevice.gpm` from one collection to the next and gives
them back with :meth:`GpuDevice.release` when its session closes.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
import math
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from .samples import MetricSpec, Sample
from .selfmetrics import Tally

log = logging.getLogger(__name__)

NVML_MODULE_ENV = "INFERWATCH_EXPORTER_NVML_MODULE"
DEFAULT_NVML_MODULE = "pynvml"

# NVML return codes (nvmlReturn_t): part of the C ABI, stable across driver releases.
SUCCESS = 0
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_NOT_FOUND = 6
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_FUNCTION_NOT_FOUND = 13
ERROR_GPU_IS_LOST = 15
ERROR_RESET_REQUIRED = 16
ERROR_LIB_RM_VERSION_MISMATCH = 18
ERROR_UNKNOWN = 999

_UNSUPPORTED = frozenset({ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND})
_GPU_GONE = frozenset({ERROR_GPU_IS_LOST, ERROR_RESET_REQUIRED})
NVML_GONE_CODES = frozenset(
    {ERROR_UNINITIALIZED, ERROR_DRIVER_NOT_LOADED, ERROR_LIBRARY_NOT_FOUND, ERROR_LIB_RM_VERSION_MISMATCH}
)
_ERROR_LABELS = {
    ERROR_UNINITIALIZED: "uninitialized",
    ERROR_INVALID_ARGUMENT: "invalid_argument",
    ERROR_NOT_SUPPORTED: "not_supported",
    ERROR_NO_PERMISSION: "no_permission",
    ERROR_NOT_FOUND: "not_found",
    ERROR_DRIVER_NOT_LOADED: "driver_not_loaded",
    ERROR_TIMEOUT: "timeout",
    ERROR_LIBRARY_NOT_FOUND: "library_not_found",
    ERROR_FUNCTION_NOT_FOUND: "not_supported",
    ERROR_GPU_IS_LOST: "gpu_lost",
    ERROR_RESET_REQUIRED: "reset_required",
    ERROR_LIB_RM_VERSION_MISMATCH: "version_mismatch",
    ERROR_UNKNOWN: "unknown",
}
# The error label of a call that did not return within the collection deadline.
HUNG = "hung"
# The error label of a GPM metric that NVML computed as NaN (its two samples too close together).
NAN = "nan"


def error_label(code: int) -> str:
    """A bounded label value for an NVML return code."""
    return _ERROR_LABELS.get(code, "other")


def load_binding(name: str) -> ModuleType:
    """Import the NVML binding module ``name``; ImportError propagates to the caller."""
    return importlib.import_module(name)


def text(value: bytes | str) -> str:
    """NVML strings arrive as bytes from older bindings and as str from newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


# nvmlValueType_t -> the member of the nvmlValue_t union that holds it.
_VALUE_MEMBERS = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")


def union_value(value_type: int, value: Any) -> float:
    """The number inside an ``nvmlValue_t`` union (field values, samples)."""
    return float(getattr(value, _VALUE_MEMBERS[value_type]))


# NVML readings that cost milliseconds each (a round trip to the GPU's firmware on recent GPUs) where the
# other calls of a poll take microseconds (tests/benchmarks/nvml_call_cost.py: 2.8 ms per utilization
# sample buffer and 3-4 ms for the energy counter on an H200, against a 12.8 ms poll). Each is read on its
# own turn, one per poll, and its last value served in between, so no poll pays for all of them.
FIRMWARE_READINGS = ("gpu_utilization_samples", "memory_bandwidth_utilization_samples", "energy")


# NVML needs the two GPM samples of a metric more than 100 ms apart ("due to the internal sample refresh
# rate", nvmlGpmMetricsGet's documentation): on an H200, samples 20 ms apart gave 0 or NaN for everything.
GPM_MIN_SECONDS = 0.1
# NVML_GPM_METRICS_GET_VERSION: part of the C ABI, like the return codes.
_GPM_METRICS_GET_VERSION = 1


def handle_key(handle: Any) -> Hashable:
    """A hashable identity for a device handle: the address behind a ctypes pointer (two pointer objects
    to one device compare unequal), or the handle itself for bindings whose handles are plain objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


@dataclass(eq=False)
class GpmBuffers:
    """The two GPM sample buffers of one GPU or GPU instance: the sample that opened the current window,
    and a spare that the sample closing it is read into. They swap roles at every closed window, so a GPU
    holds two buffers for the life of its session however long it runs."""

    opened: Any
    spare: Any
    opened_at: float | None = None  # monotonic time of the opening sample; None until one was read
    collection: int = 0  # the device's collection that last used them: a gap means the window is broken
    values: dict[int, float] = field(default_factory=dict)  # metric id -> value of the last closed window

    def close_window(self, at: float, values: dict[int, float]) -> None:
        """The spare now holds the sample that closed the window at ``at``: it opens the next one."""
        self.opened, self.spare = self.spare, self.opened
        self.opened_at, self.values = at, values


class GpuLost(Exception):
    """The GPU answered GPU_IS_LOST or RESET_REQUIRED: stop reading it for this collection."""


class NvmlGone(Exception):
    """NVML as a whole stopped working (driver unloaded or reset): the session must be reopened."""


@dataclass(eq=False)
class GpuDevice:
    """One GPU for the life of an NVML session: its handle, and what was learned about it."""

    index: int
    uuid: str
    handle: Any
    driver_version: str = ""
    cuda_driver_version: str = ""
    unsupported: set[Hashable] = field(default_factory=set)
    cache: dict[Hashable, Any] = field(default_factory=dict)
    # Per-collector memory between polls (e.g. the newest utilization sample already averaged).
    state: dict[str, Any] = field(default_factory=dict)
    collections: int = 0  # collections started on this GPU: whose turn a firmware reading is
    # GPM sample buffers by GPU instance (None: the whole GPU), allocated by NVML: see release().
    gpm: dict[int | None, GpmBuffers] = field(default_factory=dict)

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)

    def release(self, nvml: ModuleType, instances: Iterable[int | None] | None = None) -> None:
        """Give NVML back the GPM buffers of ``instances`` (None: of the GPU and every instance).

        Must run while NVML is initialised and while no collection of this GPU runs (the buffers are in
        use during one). A free that fails is logged: nothing else can be done about it.
        """
        for key in list(self.gpm if instances is None else instances):
            buffers = self.gpm.pop(key, None)
            for handle in (buffers.opened, buffers.spare) if buffers else ():
                try:
                    nvml.nvmlGpmSampleFree(handle)
                except (nvml.NVMLError, AttributeError) as exc:
                    log.debug("GPU %d: nvmlGpmSampleFree failed: %s", self.index, exc)


class GpuContext:
    """One collection of one GPU: the calls collectors make, and the samples they emit.

    Runs on a worker thread of its own, so that a call that hangs holds up only this GPU. The poller reads
    :attr:`current` to see how long the call in progress has been running, and to name it if it hangs.
    """

    def __init__(self, nvml: ModuleType, device: GpuDevice, errors: Tally) -> None:
        self.nvml = nvml
        self.device = device
        self.samples: list[Sample] = []
        # The NVML call in progress and when it started (time.monotonic()), set in one assignment so that
        # the poller's thread never sees one without the other.
        self.current: tuple[str, float] | None = None
        self.process_ids: set[int] = set()
        self._errors = errors
        self._turn = device.collections % len(FIRMWARE_READINGS)
        device.collections += 1

    @property
    def index(self) -> int:
        return self.device.index

    def emit(self, spec: MetricSpec, value: float, *labels: str) -> None:
        self.samples.append(Sample(spec, self.device.labels + labels, float(value)))

    def read(
        self,
        call: str,
        *args: Any,
        quiet: Sequence[int] = (),
        handle: Any = None,
    ) -> Any:
        """``nvml.<call>(handle, *args)``, or None when it failed or is known to be unsupported.

        ``quiet`` return codes mean "no data" for this call (e.g. NOT_FOUND: no new samples) and are
        neither counted nor learned. Support is learned per call and arguments. ``handle`` reads a
        sub-device (a MIG instance) instead of the GPU; support is not learned for those, since sub-devices
        come and go.
        """
        key = (call, *args)
        if handle is None:
            if key in self.device.unsupported:
                return None
            handle = self.device.handle
        learn = handle is self.device.handle
        return self._call(call, key, lambda fn: fn(handle, *args), quiet, learn)

    def firmware_reading(self, reading: str, read: Callable[[], float | None]) -> float | None:
        """The value of ``reading`` (one of FIRMWARE_READINGS): ``read()`` on its turn or while no value is
        known, else the value read last. A failed read leaves the series out until the next read."""
        state = self.device.state
        if reading not in state or FIRMWARE_READINGS[self._turn] == reading:
            value = read()
            if value is None:
                state.pop(reading, None)
            else:
                state[reading] = value
        return state.get(reading)

    def read_samples(self, sample_type: int, last_seen_us: int) -> tuple[int, list] | None:
        """``nvmlDeviceGetSamples``: (value type, samples of ``sample_type`` newer than ``last_seen_us``), or
        None when there are none (NOT_FOUND) or the call failed; support is learned per sample type."""
        call = "nvmlDeviceGetSamples"
        key = (call, sample_type)
        if key in self.device.unsupported:
            return None
        handle = self.device.handle
        return self._call(
            call,
            key,
            lambda fn: fn(handle, sample_type, last_seen_us),
            (ERROR_NOT_FOUND,),
            learn=True,
        )

    def read_first(self, calls: Sequence[str], *args: Any) -> Any:
        """Read the first of ``calls`` (a current name, then older ones) that this GPU supports."""
        for call in calls:
            if not self.is_unsupported(call, *args):
                value = self.read(call, *args)
                if value is not None or not self.is_unsupported(call, *args):
                    return value
        return None

    def mig_devices(self) -> Iterator[tuple[int, Any]]:
        """(slot, handle) of each MIG device of a GPU in MIG mode."""
        slots = self.cached("nvmlDeviceGetMaxMigDeviceCount") or 0
        for slot in range(slots):
            # NOT_FOUND: no MIG device in this slot.
            handle = self.read("nvmlDeviceGetMigDeviceHandleByIndex", slot, quiet=(ERROR_NOT_FOUND,))
            if handle is not None:
                yield slot, handle

    def is_unsupported(self, call: str, *args: Any) -> bool:
        return (call, *args) in self.device.unsupported

    def cached(self, call: str, *args: Any) -> Any:
        """Like :meth:`read`, for values that cannot change while the session lasts (identity, limits):
        read once successfully, then answered from memory."""
        key = (call, *args)
        if key not in self.device.cache:
            value = self.read(call, *args)
            if value is None:
                return None
            self.device.cache[key] = value
        return self.device.cache[key]

    def read_fields(self, field_ids: Sequence[int]) -> dict[int, float]:
        """Several NVML field values in one call; fields the GPU does not support are learned and dropped.

        Field values carry their own return code each, so one unsupported field does not cost the others.
        """
        call = "nvmlDeviceGetFieldValues"
        wanted = [f for f in field_ids if ("field", f) not in self.device.unsupported]
        if not wanted or (call,) in self.device.unsupported:
            return {}
        handle = self.device.handle
        values = self._call(call, (call,), lambda fn: fn(handle, wanted), (), learn=True)
        out: dict[int, float] = {}
        for fv in values or ():
            if fv.nvmlReturn == SUCCESS:
                out[fv.fieldId] = union_value(fv.valueType, fv.value)
            else:
                self._item_failed(call, "field", fv.fieldId, fv.nvmlReturn)
        return out

    def read_process_utilization(self, last_seen_us: int) -> list[Any] | None:
        """``nvmlDeviceGetProcessUtilization``: the per-process samples newer than ``last_seen_us``, ``[]``
        when there are none, None when the call failed or is not supported.

        NVML answers NOT_FOUND when no process was busy since then, and pynvml raises an error carrying
        SUCCESS when the driver's buffer is empty: both mean no samples.
        """
        call = "nvmlDeviceGetProcessUtilization"
        if (call,) in self.device.unsupported:
            return None
        handle = self.device.handle
        quiet = (ERROR_NOT_FOUND, SUCCESS)
        return self._call(call, (call,), lambda fn: fn(handle, last_seen_us), quiet, learn=True, on_quiet=[])

    # --- GPM ---------------------------------------------------------------------------------------------

    def has_gpm(self) -> bool:
        """Whether the GPU has GPM, asked once per session: one without it is learned as not supported,
        and counted, once. Decides, per GPU, whether GPM or the blocking reading gives PCIe throughput."""
        call = "nvmlGpmQueryDeviceSupport"
        if self.is_unsupported(call):
            return False
        support = self.cached(call)
        if support is None:
            return False
        if not support.isSupportedDevice:
            self._learn((call,), call, ERROR_NOT_SUPPORTED, learn=True)
            return False
        return True

    def gpm_buffers(self, instance: int | None) -> GpmBuffers | None:
        """The GPM buffers of the GPU (``instance`` None) or of one of its GPU instances, allocated by
        NVML on first use and kept in :attr:`GpuDevice.gpm`; None when NVML could not allocate them."""
        buffers = self.device.gpm.get(instance)
        if buffers is not None:
            return buffers
        call = "nvmlGpmSampleAlloc"
        if self.is_unsupported(call):
            return None
        pair = [self._call(call, (call,), lambda fn: fn(), (), learn=True) for _ in range(2)]
        if None in pair:
            for handle in pair:
                if handle is not None:
                    self._call("nvmlGpmSampleFree", (), lambda fn, h=handle: fn(h), (), learn=False)
            return None
        buffers = self.device.gpm[instance] = GpmBuffers(*pair)
        return buffers

    def gpm_sample(self, buffer: Any, instance: int | None) -> bool:
        """Read a GPM sample of the GPU, or of GPU instance ``instance``, into ``buffer``."""
        handle = self.device.handle
        if instance is None:
            call, invoke = "nvmlGpmSampleGet", lambda fn: fn(handle, buffer)
        else:
            call, invoke = "nvmlGpmMigSampleGet", lambda fn: fn(handle, instance, buffer)
        if self.is_unsupported(call):
            return False
        return self._call(call, (call,), invoke, (), learn=True) is not None

    def gpm_metrics(self, first: Any, second: Any, metric_ids: Sequence[int]) -> dict[int, float]:
        """``nvmlGpmMetricsGet`` between two samples: metric id -> value, in NVML's units.

        Each metric carries its own return code: one the GPU does not support is learned and not asked for
        again; one that failed, or came back NaN (samples too close together), is left out and counted.
        """
        call = "nvmlGpmMetricsGet"
        wanted = [m for m in metric_ids if ("gpm_metric", m) not in self.device.unsupported]
        if not wanted or self.is_unsupported(call):
            return {}
        request_type = getattr(self.nvml, "c_nvmlGpmMetricsGet_t", None)
        if request_type is None:  # a binding older than GPM
            self._learn((call,), call, ERROR_FUNCTION_NOT_FOUND, learn=True)
            return {}
        request = request_type()
        request.version = _GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1, request.sample2 = first, second
        for slot, metric_id in enumerate(wanted):
            request.metrics[slot].metricId = metric_id
        answer = self._call(call, (call,), lambda fn: fn(request), (), learn=True)
        out: dict[int, float] = {}
        for metric in answer.metrics[: len(wanted)] if answer is not None else ():
            if metric.nvmlReturn != SUCCESS:
                self._item_failed(call, "gpm_metric", metric.metricId, metric.nvmlReturn)
            elif math.isnan(metric.value):
                self._errors.add(call, NAN)
            else:
                out[metric.metricId] = float(metric.value)
        return out

    def _item_failed(self, call: str, kind: str, item: int, code: int) -> None:
        """One item of a call that answers several (a field value, a GPM metric) failed with ``code``; an
        item the GPU does not support is learned and not asked for again."""
        if code in _UNSUPPORTED:
            self.device.unsupported.add((kind, item))
        self._errors.add(call, error_label(code))

    def _call(
        self,
        call: str,
        key: Hashable,
        invoke: Callable[[Any], Any],
        quiet: Sequence[int],
        learn: bool,
        on_quiet: Any = None,
    ) -> Any:
        """``invoke(nvml.<call>)`` under the error policy; ``on_quiet`` is the answer for a ``quiet`` code."""
        fn = getattr(self.nvml, call, None)
        if fn is None:  # a binding older than the call
            self._learn(key, call, ERROR_FUNCTION_NOT_FOUND, learn)
            return None
        self.current = (call, time.monotonic())
        try:
            return invoke(fn)
        except self.nvml.NVMLError as exc:
            code = exc.value
            if code in quiet:
                return on_quiet
            if code in _UNSUPPORTED:
                self._learn(key, call, code, learn)
                return None
            self._errors.add(call, error_label(code))
            if code in _GPU_GONE:
                raise GpuLost(f"{call}: {exc}") from None
            if code in NVML_GONE_CODES:
                raise NvmlGone(f"{call}: {exc}") from None
            log.debug("GPU %d: %s failed: %s", self.device.index, call, exc)
            return None
        finally:
            self.current = None

    def _learn(self, key: Hashable, call: str, code: int, learn: bool) -> None:
        self._errors.add(call, error_label(code))
        if learn:
            self.device.unsupported.add(key)
            log.debug("GPU %d: %s is not supported; not asking again", self.device.index, call)


@dataclass(frozen=True)
class NvmlSession:
    """An initialised NVML library and the selected GPUs."""

    nvml: ModuleType
    devices: tuple[GpuDevice, ...]
    driver_version: str

    @classmethod
    def open(cls, nvml: ModuleType, selection: Sequence[str] = ()) -> NvmlSession:
        """Initialise NVML and pick the GPUs: ``selection`` holds indices or UUIDs; empty means all.

        Raises ``nvml.NVMLError`` when NVML cannot be initialised.
        """
        nvml.nvmlInit()
        try:
            driver_version = _system_string(nvml, "nvmlSystemGetDriverVersion")
            cuda_driver_version = _cuda_version(nvml)
            devices = []
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
                if not selection or str(index) in selection or uuid in selection:
                    devices.append(GpuDevice(index, uuid, handle, driver_version, cuda_driver_version))
            missing = set(selection) - {str(d.index) for d in devices} - {d.uuid for d in devices}
            if missing:
                log.warning(
                    "--gpus: %s not found among the %d GPU(s) of this machine; exporting %d",
                    ", ".join(sorted(missing)),
                    nvml.nvmlDeviceGetCount(),
                    len(devices),
                )
            return cls(nvml, tuple(devices), driver_version)
        except nvml.NVMLError:
            nvml.nvmlShutdown()
            raise

    def close(self, busy: Collection[GpuDevice] = ()) -> None:
        """Give back what NVML allocated for the GPUs (GPM buffers), then shut NVML down.

        ``busy`` GPUs have a thread stuck inside NVML: their buffers are left alone, and so is NVML, since
        shutting it down under a thread stuck in it is asking for a crash.
        """
        for device in self.devices:
            if device not in busy:
                device.release(self.nvml)
        if busy:
            return
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as exc:
            log.debug("nvmlShutdown failed: %s", exc)


def _system_string(nvml: ModuleType, call: str) -> str:
    try:
        return text(getattr(nvml, call)())
    except (nvml.NVMLError, AttributeError):
        return ""


def _cuda_version(nvml: ModuleType) -> str:
    """The CUDA version the driver supports, as ``major.minor`` (NVML encodes 12040 for 12.4)."""
    try:
        version = nvml.nvmlSystemGetCudaDriverVersion()
    except (nvml.NVMLError, AttributeError):
        return ""
    return f"{version // 1000}.{version % 1000 // 10}"
