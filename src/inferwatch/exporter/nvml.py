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

What collectors keep about a GPU from one poll to the next is typed: each keeps a state object of its
own class in the GPU's :class:`GpuDevice` (:meth:`GpuDevice.state`), and one that holds what NVML
allocated (GPM sample buffers, :mod:`.gpm_samples`) gives it back when the session closes.
"""

from __future__ import annotations

import ctypes
import importlib
import logging
from collections.abc import Callable, Collection, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar, runtime_checkable

from inferwatch.common.clock import SYSTEM_CLOCK, Clock

from .samples import FamilySpec, Sample
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


def handle_key(handle: Any) -> Hashable:
    """A hashable identity for a device handle: the address behind a ctypes pointer (two pointer objects
    to one device compare unequal), or the handle itself for bindings whose handles are plain objects."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return handle


class GpuLost(Exception):
    """The GPU answered GPU_IS_LOST or RESET_REQUIRED: stop reading it for this collection."""


class NvmlGone(Exception):
    """NVML as a whole stopped working (driver unloaded or reset): the session must be reopened."""


@runtime_checkable
class HoldsNvmlResources(Protocol):
    """A collector's state that holds what NVML allocated for a GPU, to give back when the session ends."""

    def release(self, nvml: ModuleType, gpu: int) -> None: ...


State = TypeVar("State")


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
    collections: int = 0  # collections started on this GPU
    # Each collector's memory between polls, by its class (e.g. the newest utilization sample averaged).
    _states: dict[type, Any] = field(default_factory=dict)

    @property
    def labels(self) -> tuple[str, str]:
        return (str(self.index), self.uuid)

    def state(self, kind: type[State]) -> State:
        """This GPU's state of class ``kind`` (one per collector that keeps some), made on first use."""
        if kind not in self._states:
            self._states[kind] = kind()
        return self._states[kind]

    def release(self, nvml: ModuleType) -> None:
        """Give NVML back what the collectors' states hold (GPM buffers) for this GPU.

        Must run while NVML is initialised and while no collection of this GPU runs.
        """
        for state in self._states.values():
            if isinstance(state, HoldsNvmlResources):
                state.release(nvml, self.index)


class GpuContext:
    """One collection of one GPU: the calls collectors make, and the samples they emit.

    Runs on a worker thread of its own, so that a call that hangs holds up only this GPU. The poller reads
    :attr:`current` to see how long the call in progress has been running, and to name it if it hangs.
    """

    def __init__(
        self, nvml: ModuleType, device: GpuDevice, errors: Tally, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.nvml = nvml
        self.device = device
        self.clock = clock  # also the clock of collectors' windows (GPM)
        self.samples: list[Sample] = []
        # The NVML call in progress and when it started (clock.monotonic()), set in one assignment so that
        # the poller's thread never sees one without the other.
        self.current: tuple[str, float] | None = None
        self.process_ids: set[int] = set()
        self._errors = errors
        self.collection = device.collections  # the number of this collection of the GPU, from 0
        device.collections += 1

    @property
    def index(self) -> int:
        return self.device.index

    def emit(self, spec: FamilySpec, value: float, *labels: str) -> None:
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
        return self.call(call, key, lambda fn: fn(handle, *args), quiet, learn)

    def read_samples(self, sample_type: int, last_seen_us: int) -> tuple[int, list] | None:
        """``nvmlDeviceGetSamples``: (value type, samples of ``sample_type`` newer than ``last_seen_us``), or
        None when there are none (NOT_FOUND) or the call failed; support is learned per sample type."""
        call = "nvmlDeviceGetSamples"
        key = (call, sample_type)
        if key in self.device.unsupported:
            return None
        handle = self.device.handle
        return self.call(
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
        values = self.call(call, (call,), lambda fn: fn(handle, wanted), (), learn=True)
        out: dict[int, float] = {}
        for fv in values or ():
            if fv.nvmlReturn == SUCCESS:
                out[fv.fieldId] = union_value(fv.valueType, fv.value)
            else:
                self.item_failed(call, "field", fv.fieldId, fv.nvmlReturn)
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
        return self.call(call, (call,), lambda fn: fn(handle, last_seen_us), quiet, learn=True, on_quiet=[])

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
            self.learn_unsupported((call,), call, ERROR_NOT_SUPPORTED, learn=True)
            return False
        return True

    def item_failed(self, call: str, kind: str, item: int, code: int) -> None:
        """One item of a call that answers several (a field value, a GPM metric) failed with ``code``; an
        item the GPU does not support is learned and not asked for again."""
        if code in _UNSUPPORTED:
            self.device.unsupported.add((kind, item))
        self._errors.add(call, error_label(code))

    def call(
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
            self.learn_unsupported(key, call, ERROR_FUNCTION_NOT_FOUND, learn)
            return None
        self.current = (call, self.clock.monotonic())
        try:
            return invoke(fn)
        except self.nvml.NVMLError as exc:
            code = exc.value
            if code in quiet:
                return on_quiet
            if code in _UNSUPPORTED:
                self.learn_unsupported(key, call, code, learn)
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

    def count_error(self, call: str, error: str) -> None:
        """Count a failure of ``call`` that is not an NVML return code (``NAN``)."""
        self._errors.add(call, error)

    def learn_unsupported(self, key: Hashable, call: str, code: int, learn: bool) -> None:
        """Count ``call``'s failure with ``code`` and, with ``learn``, never make it again (``key``)."""
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
