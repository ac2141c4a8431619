"""A fault-injecting stand-in for the NVML binding, with pynvml's interface, for the exporter's fault paths.

Used ONLY by tests, to drive what a real GPU cannot be made to do on demand: several GPUs, a call that is
not supported, a GPU lost mid-run, a call that hangs, an XID event, a driver reset. The exporter loads it
like the real binding: in-process through the ``nvml`` argument, in a subprocess through
``INFERWATCH_EXPORTER_NVML_MODULE=tests.unit.exporter.fake_nvml``.

Scenario (what the GPUs are), from :func:`reset` or the JSON in ``FAKE_NVML_SCENARIO`` at import:
``gpus`` (count), ``not_supported`` ({call: [gpu indices]}), ``failing`` ({call: [gpu indices]}: the call
fails with an unknown error), ``nvlink`` / ``mig`` (gpu indices that have them), ``no_gpm`` (gpu indices
whose GPM support query says no), ``gpm_nan`` (gpu indices whose GPM metrics all come back NaN),
``processes`` ({gpu index: [[pid, bytes], ...]}, or ``[pid, bytes, sm %, memory %]`` for a process
busy on the GPU), ``hw_slowdown`` (gpu indices in hardware slowdown, beside the power cap every GPU
reports), ``init_failures`` (nvmlInit fails that often first), ``no_library`` (nvmlInit always
fails as on a machine without the driver).

GPM is here for its fault paths: samples live in buffers that must be freed (:func:`gpm_buffers_live`
counts those not freed), metrics of two samples 100 ms apart or less are NaN as on a real GPU, and the
values otherwise are constants (:data:`GPM_VALUES`), not a model of a GPU.

Faults during a run, from :func:`command` or one JSON object per line appended to the file named by
``FAKE_NVML_CONTROL`` (read before every call): ``{"op": "hang", "gpu": 1, "call": "...", "seconds": 30}``,
``{"op": "lose", "gpu": 2}``, ``{"op": "recover", "gpu": 2}``, ``{"op": "xid", "gpu": 0, "xid": 79}``,
``{"op": "driver_reset"}`` (calls fail as uninitialised until nvmlInit, and every hardware counter
restarts from zero, as after a driver reload; ``"at": UNIX_TIME`` dates it, so that a second process
reading the same file, a restarted exporter, sees the same driver), ``{"op": "ecc", "count": 3}``
(corrected ECC errors on every GPU: volatile counts since driver load, aggregate ones for good),
``{"op": "mig_slots", "slots": [0]}`` (the MIG devices that exist on MIG GPUs from now on, as after a
reconfiguration). The scenario's ``driver_loaded_at`` (Unix time) dates the driver's first load.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999

NVML_TEMPERATURE_GPU = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlMemory_v2 = 0x02000028
nvmlEventTypeXidCriticalError = 0x8

_GIB = 1 << 30
_SAMPLE_PERIOD_US = 166_667  # NVML's utilization sample period on recent GPUs
_SAMPLE_HISTORY_US = 5_000_000
_POWER_MW = 350_000
_UTILIZATION_PATTERN = (90, 10)  # alternating samples: the mean is 50 %, a point reading is 90 or 10
_THROTTLED_FRACTION = 0.1  # of the time since driver load, counted as sw_power_cap violation
_MEMORY_TEMP_FIELD = 82
_VIOLATION_FIELDS = (74, 76, 77, 78, 79, 269, 270, 271)
_NVLINK_ERROR_FIELDS = (38, 45, 52, 59)
_NVLINK_LINKS, _NVLINK_ACTIVE = 18, 4
_MIG_SLOTS = 7
_GPM_MIN_SECONDS = 0.1
NVML_GPM_METRIC_MAX = 477
# GPM metric id -> value (percent, or MiB/s), for the whole GPU; a GPU instance gets half of each.
GPM_VALUES = {2: 60.0, 3: 25.0, 5: 45.0, 10: 30.0, 11: 0.0, 12: 10.0, 13: 5.0, 20: 100.0, 21: 200.0}
_GPM_NVLINK_VALUES = {60: 1000.0, 61: 1500.0}  # GPUs with NVLink only


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass(frozen=True)
class _Handle:
    gpu: int
    mig: int | None = None


@dataclass
class _State:
    gpus: int = 2
    not_supported: dict[str, list[int]] = field(default_factory=dict)
    failing: dict[str, list[int]] = field(default_factory=dict)
    nvlink: list[int] = field(default_factory=list)
    mig: list[int] = field(default_factory=list)
    mig_slots: list[int] = field(default_factory=lambda: [0, 1])  # the MIG devices present
    no_gpm: list[int] = field(default_factory=list)
    gpm_nan: list[int] = field(default_factory=list)
    processes: dict[int, list[list[int]]] = field(default_factory=dict)
    hw_slowdown: list[int] = field(default_factory=list)
    init_failures: int = 0
    no_library: bool = False
    initialized: bool = False
    driver_loaded_at: float = field(default_factory=time.time)
    ecc_volatile: int = 2  # corrected ECC errors since the driver loaded, on every GPU
    ecc_aggregate: int = 2  # ... and in the GPU's lifetime
    lost: set[int] = field(default_factory=set)
    hangs: dict[tuple[int, str], float] = field(default_factory=dict)  # -> monotonic end
    events: list[tuple[int, int]] = field(default_factory=list)  # (gpu, xid)
    registered: set[int] = field(default_factory=set)
    control_offset: int = 0
    gpm_buffers: set[int] = field(default_factory=set)  # ids of allocated, not yet freed sample buffers


_lock = threading.Condition()
_state = _State()
# (gpu, call) -> times called, for tests that count retries; gpu -1 for library calls.
calls: Counter[tuple[int, str]] = Counter()


def reset(**scenario: Any) -> None:
    """Start over with a new scenario (in-process tests)."""
    global _state
    with _lock:
        _state = _State(**scenario)
        _state.processes = {int(k): v for k, v in _state.processes.items()}
        calls.clear()


def command(op: str, **args: Any) -> None:
    """Inject a fault now (in-process tests); subprocess tests append the same as JSON to the control file."""
    with _lock:
        _apply(dict(op=op, **args))
        _lock.notify_all()


def _apply(cmd: dict[str, Any]) -> None:
    op = cmd["op"]
    if op == "hang":
        _state.hangs[(cmd["gpu"], cmd["call"])] = time.monotonic() + cmd["seconds"]
    elif op == "lose":
        _state.lost.add(cmd["gpu"])
    elif op == "recover":
        _state.lost.discard(cmd["gpu"])
    elif op == "xid":
        _state.events.append((cmd["gpu"], cmd["xid"]))
    elif op == "mig_slots":
        _state.mig_slots = cmd["slots"]
    elif op == "driver_reset":
        _state.initialized = False
        _state.driver_loaded_at = cmd.get("at", time.time())
        _state.registered.clear()
        _state.ecc_volatile = 0
    elif op == "ecc":
        _state.ecc_volatile += cmd["count"]
        _state.ecc_aggregate += cmd["count"]
    else:
        raise ValueError(f"unknown fake NVML command {op!r}")


def _read_control_file() -> None:
    path = os.environ.get("FAKE_NVML_CONTROL")
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as control:
        control.seek(_state.control_offset)
        new = control.read()
    complete = new[: new.rfind("\n") + 1]  # a line being written is read next time
    _state.control_offset += len(complete.encode())
    for line in complete.splitlines():
        if line.strip():
            _apply(json.loads(line))
    if complete:
        _lock.notify_all()


def _enter(handle: _Handle | None, call: str) -> None:
    """Every API function starts here: faults are applied, then the call may hang or fail."""
    with _lock:
        _read_control_file()
        if not _state.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is None:
            return
        calls[(handle.gpu, call)] += 1
        if handle.gpu in _state.lost:
            raise NVMLError(NVML_ERROR_GPU_IS_LOST)
        if handle.gpu in _state.not_supported.get(call, ()):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if handle.gpu in _state.failing.get(call, ()):
            raise NVMLError(NVML_ERROR_UNKNOWN)
        hang_until = _state.hangs.get((handle.gpu, call), 0.0)
    remaining = hang_until - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def _since_driver_load() -> float:
    return max(time.time() - _state.driver_loaded_at, 0.0)


# --- library and system -------------------------------------------------------------------------------


def nvmlInit() -> None:
    with _lock:
        _read_control_file()
        calls[(-1, "nvmlInit")] += 1
        if _state.no_library:
            raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
        if _state.init_failures > 0:
            _state.init_failures -= 1
            raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
        _state.initialized = True


def nvmlShutdown() -> None:
    _enter(None, "nvmlShutdown")
    _state.initialized = False


def nvmlSystemGetDriverVersion() -> str:
    _enter(None, "nvmlSystemGetDriverVersion")
    return "570.00.fake"


def nvmlSystemGetCudaDriverVersion() -> int:
    _enter(None, "nvmlSystemGetCudaDriverVersion")
    return 12080


def nvmlDeviceGetCount() -> int:
    _enter(None, "nvmlDeviceGetCount")
    return _state.gpus


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    _enter(None, "nvmlDeviceGetHandleByIndex")
    if not 0 <= index < _state.gpus:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Handle(index)


# --- identity -----------------------------------------------------------------------------------------


def nvmlDeviceGetUUID(handle: _Handle) -> str:
    _enter(handle, "nvmlDeviceGetUUID")
    if handle.mig is not None:
        return mig_uuid(handle.gpu, handle.mig)
    return gpu_uuid(handle.gpu)


def gpu_uuid(gpu: int) -> str:
    """The UUID the stand-in gives GPU ``gpu``, as NVML spells UUIDs."""
    return f"GPU-fa4e0000-0000-4000-8000-{gpu:012d}"


def mig_uuid(gpu: int, slot: int) -> str:
    """The UUID the stand-in gives the MIG device in ``slot`` of GPU ``gpu`` (GPU instance id slot + 1)."""
    return f"MIG-fa4e{gpu:04d}-0000-4000-8000-{slot:012d}"


def nvmlDeviceGetName(handle: _Handle) -> str:
    _enter(handle, "nvmlDeviceGetName")
    return "NVIDIA H200 (stand-in)"


def nvmlDeviceGetPciInfo(handle: _Handle) -> SimpleNamespace:
    _enter(handle, "nvmlDeviceGetPciInfo")
    return SimpleNamespace(busId=f"00000000:{0x18 + handle.gpu:02X}:00.0".encode())


def nvmlDeviceGetSerial(handle: _Handle) -> str:
    _enter(handle, "nvmlDeviceGetSerial")
    return f"16520000{handle.gpu:05d}"


def nvmlDeviceGetVbiosVersion(handle: _Handle) -> str:
    _enter(handle, "nvmlDeviceGetVbiosVersion")
    return "96.00.AF.00.01"


def nvmlDeviceGetCudaComputeCapability(handle: _Handle) -> tuple[int, int]:
    _enter(handle, "nvmlDeviceGetCudaComputeCapability")
    return (9, 0)


def nvmlDeviceGetPersistenceMode(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetPersistenceMode")
    return 1


# --- utilization and memory ---------------------------------------------------------------------------


def _sample_value(timestamp_us: int) -> int:
    return _UTILIZATION_PATTERN[(timestamp_us // _SAMPLE_PERIOD_US) % len(_UTILIZATION_PATTERN)]


def nvmlDeviceGetSamples(handle: _Handle, sample_type: int, last_seen_us: int) -> tuple[int, list]:
    _enter(handle, "nvmlDeviceGetSamples")
    now_us = int(time.time() * 1e6)
    first = max(last_seen_us + 1, now_us - _SAMPLE_HISTORY_US)
    first += -first % _SAMPLE_PERIOD_US
    stamps = range(first, now_us + 1, _SAMPLE_PERIOD_US)
    if not stamps:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    samples = [
        SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=_sample_value(t))) for t in stamps
    ]
    return NVML_VALUE_TYPE_UNSIGNED_INT, samples


def nvmlDeviceGetUtilizationRates(handle: _Handle) -> SimpleNamespace:
    _enter(handle, "nvmlDeviceGetUtilizationRates")
    latest = _sample_value(int(time.time() * 1e6))
    return SimpleNamespace(gpu=latest, memory=latest)


def nvmlDeviceGetMemoryInfo(handle: _Handle, version: int | None = None) -> SimpleNamespace:
    _enter(handle, "nvmlDeviceGetMemoryInfo")
    if handle.mig is not None:
        return SimpleNamespace(total=18 * _GIB, used=1 * _GIB, free=17 * _GIB)
    total, reserved, used = 141 * _GIB, _GIB // 2, 20 * _GIB
    if version == nvmlMemory_v2:
        return SimpleNamespace(total=total, reserved=reserved, used=used, free=total - reserved - used)
    return SimpleNamespace(total=total, used=used + reserved, free=total - reserved - used)


# --- power, thermal, clocks ---------------------------------------------------------------------------


def nvmlDeviceGetPowerUsage(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetPowerUsage")
    return _POWER_MW


def nvmlDeviceGetEnforcedPowerLimit(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetEnforcedPowerLimit")
    return 700_000


def nvmlDeviceGetTotalEnergyConsumption(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetTotalEnergyConsumption")
    return int(_since_driver_load() * _POWER_MW)  # mJ at a steady draw since the driver loaded


def nvmlDeviceGetTemperature(handle: _Handle, sensor: int) -> int:
    _enter(handle, "nvmlDeviceGetTemperature")
    return 45


def nvmlDeviceGetTemperatureThreshold(handle: _Handle, threshold: int) -> int:
    _enter(handle, "nvmlDeviceGetTemperatureThreshold")
    return {0: 92, 1: 89, 2: 95, 3: 87}[threshold]


def nvmlDeviceGetClockInfo(handle: _Handle, clock: int) -> int:
    _enter(handle, "nvmlDeviceGetClockInfo")
    return (1755, 1755, 3201, 1620)[clock]


def nvmlDeviceGetMaxClockInfo(handle: _Handle, clock: int) -> int:
    _enter(handle, "nvmlDeviceGetMaxClockInfo")
    return (1980, 1980, 3201, 1755)[clock]


def nvmlDeviceGetPerformanceState(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetPerformanceState")
    return 0


def nvmlDeviceGetCurrentClocksEventReasons(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetCurrentClocksEventReasons")
    return 0x4 | (0x8 if handle.gpu in _state.hw_slowdown else 0)  # sw_power_cap, hw_slowdown


def nvmlDeviceGetSupportedClocksEventReasons(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetSupportedClocksEventReasons")
    return 0x1FF


def nvmlDeviceGetFieldValues(handle: _Handle, field_ids: list[int]) -> list[SimpleNamespace]:
    _enter(handle, "nvmlDeviceGetFieldValues")
    supported = {_MEMORY_TEMP_FIELD: 52.0}
    violation_ns = _since_driver_load() * _THROTTLED_FRACTION * 1e9
    supported.update(dict.fromkeys(_VIOLATION_FIELDS, 0.0))
    supported[74] = violation_ns
    if handle.gpu in _state.nvlink:
        supported.update(dict.fromkeys(_NVLINK_ERROR_FIELDS, 1.0))
    out = []
    for field_id in field_ids:
        value = supported.get(field_id)
        out.append(
            SimpleNamespace(
                fieldId=field_id,
                nvmlReturn=NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED,
                valueType=NVML_VALUE_TYPE_UNSIGNED_LONG_LONG,
                value=SimpleNamespace(ullVal=int(value or 0)),
            )
        )
    return out


# --- PCIe, ECC --------------------------------------------------------------------------------------


def nvmlDeviceGetCurrPcieLinkGeneration(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
    return 5


def nvmlDeviceGetCurrPcieLinkWidth(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetCurrPcieLinkWidth")
    return 16


def nvmlDeviceGetMaxPcieLinkGeneration(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
    return 5


def nvmlDeviceGetMaxPcieLinkWidth(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetMaxPcieLinkWidth")
    return 16


def nvmlDeviceGetPcieReplayCounter(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetPcieReplayCounter")
    return 0


def nvmlDeviceGetPcieThroughput(handle: _Handle, counter: int) -> int:
    _enter(handle, "nvmlDeviceGetPcieThroughput")
    return 2048


def nvmlDeviceGetEccMode(handle: _Handle) -> list[int]:
    _enter(handle, "nvmlDeviceGetEccMode")
    return [1, 1]


def nvmlDeviceGetTotalEccErrors(handle: _Handle, error_type: int, counter_type: int) -> int:
    _enter(handle, "nvmlDeviceGetTotalEccErrors")
    if error_type != 0:  # uncorrected
        return 0
    return _state.ecc_volatile if counter_type == 0 else _state.ecc_aggregate


def nvmlDeviceGetRemappedRows(handle: _Handle) -> tuple[int, int, int, int]:
    _enter(handle, "nvmlDeviceGetRemappedRows")
    return (1, 0, 0, 0)


# --- NVLink, MIG, processes ---------------------------------------------------------------------------


def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
    _enter(handle, "nvmlDeviceGetNvLinkState")
    if handle.gpu not in _state.nvlink:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    if link >= _NVLINK_LINKS:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return 1 if link < _NVLINK_ACTIVE else 0


def nvmlDeviceGetMigMode(handle: _Handle) -> list[int]:
    _enter(handle, "nvmlDeviceGetMigMode")
    enabled = 1 if handle.gpu in _state.mig else 0
    return [enabled, enabled]


def nvmlDeviceGetMaxMigDeviceCount(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetMaxMigDeviceCount")
    return _MIG_SLOTS


def nvmlDeviceGetMigDeviceHandleByIndex(handle: _Handle, slot: int) -> _Handle:
    _enter(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
    if handle.gpu not in _state.mig or slot not in _state.mig_slots:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _Handle(handle.gpu, slot)


def nvmlDeviceGetGpuInstanceId(handle: _Handle) -> int:
    _enter(handle, "nvmlDeviceGetGpuInstanceId")
    if handle.mig is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return handle.mig + 1


def nvmlDeviceGetComputeRunningProcesses(handle: _Handle) -> list[SimpleNamespace]:
    _enter(handle, "nvmlDeviceGetComputeRunningProcesses")
    return [
        SimpleNamespace(pid=entry[0], usedGpuMemory=entry[1])
        for entry in _state.processes.get(handle.gpu, [])
    ]


def nvmlDeviceGetProcessUtilization(handle: _Handle, last_seen_us: int) -> list[SimpleNamespace]:
    """One sample per busy process, stamped with the latest sample period; NOT_FOUND when none is newer."""
    _enter(handle, "nvmlDeviceGetProcessUtilization")
    stamp = int(time.time() * 1e6) // _SAMPLE_PERIOD_US * _SAMPLE_PERIOD_US
    busy = [entry for entry in _state.processes.get(handle.gpu, []) if len(entry) > 2]
    if stamp <= last_seen_us or not busy:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return [SimpleNamespace(pid=e[0], timeStamp=stamp, smUtil=e[2], memUtil=e[3]) for e in busy]


# --- GPM ----------------------------------------------------------------------------------------------


@dataclass
class _GpmSample:
    gpu: int | None = None
    instance: int | None = None
    taken_at: float = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: _GpmSample | None = None
        self.sample2: _GpmSample | None = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0)
            for _ in range(NVML_GPM_METRIC_MAX)
        ]


def gpm_buffers_live() -> int:
    """Sample buffers allocated and not freed: 0 once an exporter has stopped."""
    with _lock:
        return len(_state.gpm_buffers)


def nvmlGpmQueryDeviceSupport(handle: _Handle) -> SimpleNamespace:
    _enter(handle, "nvmlGpmQueryDeviceSupport")
    return SimpleNamespace(version=1, isSupportedDevice=0 if handle.gpu in _state.no_gpm else 1)


def nvmlGpmSampleAlloc() -> _GpmSample:
    _enter(None, "nvmlGpmSampleAlloc")
    sample = _GpmSample()
    with _lock:
        _state.gpm_buffers.add(id(sample))
    return sample


def nvmlGpmSampleFree(sample: _GpmSample) -> None:
    # Host memory going back: unlike the other calls, answered while the library is uninitialised too.
    with _lock:
        if id(sample) not in _state.gpm_buffers:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # freed twice, or never allocated
        _state.gpm_buffers.discard(id(sample))


def _gpm_sample(handle: _Handle, instance: int | None, sample: _GpmSample) -> _GpmSample:
    if handle.gpu in _state.no_gpm or id(sample) not in _state.gpm_buffers:
        raise NVMLError(
            NVML_ERROR_NOT_SUPPORTED if handle.gpu in _state.no_gpm else NVML_ERROR_INVALID_ARGUMENT
        )
    sample.gpu, sample.instance, sample.taken_at = handle.gpu, instance, time.monotonic()
    return sample


def nvmlGpmSampleGet(handle: _Handle, sample: _GpmSample) -> _GpmSample:
    _enter(handle, "nvmlGpmSampleGet")
    return _gpm_sample(handle, None, sample)


def nvmlGpmMigSampleGet(handle: _Handle, gpu_instance: int, sample: _GpmSample) -> _GpmSample:
    _enter(handle, "nvmlGpmMigSampleGet")
    if handle.gpu not in _state.mig or gpu_instance - 1 not in _state.mig_slots:
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    return _gpm_sample(handle, gpu_instance, sample)


def nvmlGpmMetricsGet(request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
    first, second = request.sample1, request.sample2
    if (
        first is None
        or second is None
        or first.gpu is None
        or (first.gpu, first.instance)
        != (
            second.gpu,
            second.instance,
        )
    ):
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    _enter(_Handle(first.gpu), "nvmlGpmMetricsGet")
    too_close = second.taken_at - first.taken_at <= _GPM_MIN_SECONDS
    values = dict(GPM_VALUES)
    if first.gpu in _state.nvlink and first.instance is None:
        values.update(_GPM_NVLINK_VALUES)
    for metric in request.metrics[: request.numMetrics]:
        value = values.get(metric.metricId)
        metric.nvmlReturn = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
        if too_close or first.gpu in _state.gpm_nan:
            value = float("nan")
        metric.value = (value or 0.0) / (1 if first.instance is None else 2)
    return request


# --- events -------------------------------------------------------------------------------------------


def nvmlEventSetCreate() -> object:
    _enter(None, "nvmlEventSetCreate")
    return object()


def nvmlDeviceRegisterEvents(handle: _Handle, event_types: int, event_set: object) -> None:
    _enter(handle, "nvmlDeviceRegisterEvents")
    with _lock:
        _state.registered.add(handle.gpu)


def nvmlEventSetWait_v2(event_set: object, timeout_ms: int) -> SimpleNamespace:
    deadline = time.monotonic() + timeout_ms / 1000
    with _lock:
        while True:
            _read_control_file()
            if not _state.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            for i, (gpu, xid) in enumerate(_state.events):
                if gpu in _state.registered:
                    del _state.events[i]
                    return SimpleNamespace(
                        device=_Handle(gpu), eventType=nvmlEventTypeXidCriticalError, eventData=xid
                    )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            _lock.wait(min(remaining, 0.05))  # also re-reads the control file while waiting


def nvmlEventSetFree(event_set: object) -> None:
    return None


if os.environ.get("FAKE_NVML_SCENARIO"):
    reset(**json.loads(os.environ["FAKE_NVML_SCENARIO"]))
