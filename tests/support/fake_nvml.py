"""A fault-injecting stand-in for the NVML binding, with pynvml's interface, for the exporter's fault paths.

Used ONLY by tests, to drive what a real GPU cannot be made to do on demand: several GPUs, a call that is
not supported, a GPU lost mid-run, a call that hangs, an XID event, a driver reset. Each test builds its
own :class:`FakeNvml` from a :class:`Scenario` (the data of what the GPUs are) and passes it to the
exporter as its binding; the fault commands are its methods. A clock can be given (a test's manual
clock): every value the stand-in derives from time (utilization samples, energy and throttle time since
the driver loaded, GPM sample times, hangs) then follows it.

In a subprocess the exporter loads this module as its binding
(``INFERWATCH_EXPORTER_NVML_MODULE=tests.support.fake_nvml``): the module then stands for one
:class:`FakeNvml` built from the JSON scenario in ``FAKE_NVML_SCENARIO``, which reads the fault commands
of the test, one JSON object per line appended to the file named by ``FAKE_NVML_CONTROL`` (read before
every call).

Scenario fields: ``gpus`` (count), ``not_supported`` ({call: [gpu indices]}), ``failing`` ({call: [gpu
indices]}: the call fails with an unknown error), ``nvlink`` / ``mig`` (gpu indices that have them),
``mig_slots`` (the MIG devices on MIG GPUs), ``no_gpm`` (gpu indices whose GPM support query says no),
``gpm_nan`` (gpu indices whose GPM metrics all come back NaN), ``processes`` ({gpu index: [[pid, bytes],
...]}, or ``[pid, bytes, sm %, memory %]`` for a process busy on the GPU), ``hw_slowdown`` (gpu indices in
hardware slowdown, beside the power cap every GPU reports), ``init_failures`` (nvmlInit fails that often
first), ``no_library`` (nvmlInit always fails as on a machine without the driver), ``driver_loaded_at``
(Unix time of the driver's first load; now by default).

Commands (:meth:`FakeNvml.command`, or a JSON line ``{"op": ...}`` in the control file):
``hang`` (``gpu``, ``call``, ``seconds``), ``lose`` / ``recover`` (``gpu``), ``xid`` (``gpu``, ``xid``),
``driver_reset`` (calls fail as uninitialised until nvmlInit, and every hardware counter restarts from
zero, as after a driver reload; ``"at": UNIX_TIME`` dates it, so that a second process reading the same
file, a restarted exporter, sees the same driver), ``ecc`` (``count`` corrected ECC errors on every GPU:
volatile counts since driver load, aggregate ones for good), ``mig_slots`` (``slots``: the MIG devices
that exist on MIG GPUs from now on, as after a reconfiguration).

GPM is here for its fault paths (:mod:`.fake_gpm`): samples live in buffers that must be freed
(:meth:`FakeNvml.gpm_buffers_live` counts those not freed), metrics of two samples 100 ms apart or less
are NaN as on a real GPU, and the values otherwise are constants, not a model of a GPU.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

from inferwatch.common.clock import SYSTEM_CLOCK, Clock
from tests.support.fake_events import EventsApi
from tests.support.fake_gpm import GpmApi
from tests.support.fake_nvml_types import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_GPU_IS_LOST,
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_ERROR_UNINITIALIZED,
    NVML_ERROR_UNKNOWN,
    NVML_SUCCESS,
    Handle,
    NVMLError,
    Scenario,
    gpu_uuid,
    mig_uuid,
)

NVML_TEMPERATURE_GPU = 0
NVML_GPU_UTILIZATION_SAMPLES = 1
NVML_MEMORY_UTILIZATION_SAMPLES = 2
NVML_VALUE_TYPE_UNSIGNED_INT = 1
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3
nvmlMemory_v2 = 0x02000028

SCENARIO_ENV = "FAKE_NVML_SCENARIO"
CONTROL_ENV = "FAKE_NVML_CONTROL"

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
# Answers that never change, by call: (value for GPU index) or a constant.
_CONSTANTS: dict[str, Any] = {
    "nvmlDeviceGetName": "NVIDIA H200 (stand-in)",
    "nvmlDeviceGetVbiosVersion": "96.00.AF.00.01",
    "nvmlDeviceGetCudaComputeCapability": (9, 0),
    "nvmlDeviceGetPersistenceMode": 1,
    "nvmlDeviceGetPowerUsage": _POWER_MW,
    "nvmlDeviceGetEnforcedPowerLimit": 700_000,
    "nvmlDeviceGetPerformanceState": 0,
    "nvmlDeviceGetSupportedClocksEventReasons": 0x1FF,
    "nvmlDeviceGetCurrPcieLinkGeneration": 5,
    "nvmlDeviceGetCurrPcieLinkWidth": 16,
    "nvmlDeviceGetMaxPcieLinkGeneration": 5,
    "nvmlDeviceGetMaxPcieLinkWidth": 16,
    "nvmlDeviceGetPcieReplayCounter": 0,
    "nvmlDeviceGetEccMode": [1, 1],
    "nvmlDeviceGetRemappedRows": (1, 0, 0, 0),
    "nvmlDeviceGetMaxMigDeviceCount": _MIG_SLOTS,
}


class FakeNvml(GpmApi, EventsApi):
    """One stand-in NVML library and its GPUs. Its ``nvml*`` methods are pynvml's functions."""

    NVMLError = NVMLError
    nvmlMemory_v2 = nvmlMemory_v2

    def __init__(
        self, scenario: Scenario | None = None, clock: Clock = SYSTEM_CLOCK, control: str | None = None
    ) -> None:
        self.clock = clock
        self.control = control  # the file of fault commands, or None
        self._lock = threading.Condition()
        self._control_offset = 0
        self.reset(scenario or Scenario())

    def reset(self, scenario: Scenario | None = None, **fields: Any) -> None:
        """Start over with ``scenario`` (or one made of ``fields``): the GPUs as new, no call counted."""
        scenario = scenario or Scenario.from_json(fields)
        with self._lock:
            self.scenario = scenario
            self.initialized = False
            self.init_failures = scenario.init_failures
            self.mig_slots = list(scenario.mig_slots)
            loaded = scenario.driver_loaded_at
            self.driver_loaded_at = self.clock.time() if loaded is None else loaded
            self.ecc_volatile = self.ecc_aggregate = 2  # corrected ECC errors since driver load, in life
            self.lost: set[int] = set()
            self.hangs: dict[tuple[int, str], float] = {}  # -> monotonic end
            self.events: list[tuple[int, int]] = []  # (gpu, xid)
            self.registered: set[int] = set()
            self.gpm_buffers: set[int] = set()  # ids of allocated, not yet freed sample buffers
            # (gpu, call) -> times called, for tests that count retries; gpu -1 for library calls.
            self.calls: Counter[tuple[int, str]] = Counter()

    # --- faults ---------------------------------------------------------------------------------------

    def command(self, op: str, **args: Any) -> None:
        """Inject a fault now; a subprocess's test appends the same as JSON to the control file."""
        with self._lock:
            self._apply(dict(op=op, **args))
            self._lock.notify_all()

    def hang(self, gpu: int, call: str, seconds: float) -> None:
        self.command("hang", gpu=gpu, call=call, seconds=seconds)

    def lose(self, gpu: int) -> None:
        self.command("lose", gpu=gpu)

    def recover(self, gpu: int) -> None:
        self.command("recover", gpu=gpu)

    def _apply(self, cmd: dict[str, Any]) -> None:
        op = cmd["op"]
        if op == "hang":
            self.hangs[(cmd["gpu"], cmd["call"])] = self.clock.monotonic() + cmd["seconds"]
        elif op == "lose":
            self.lost.add(cmd["gpu"])
        elif op == "recover":
            self.lost.discard(cmd["gpu"])
        elif op == "xid":
            self.events.append((cmd["gpu"], cmd["xid"]))
        elif op == "mig_slots":
            self.mig_slots = cmd["slots"]
        elif op == "driver_reset":
            self.initialized = False
            self.driver_loaded_at = cmd.get("at", self.clock.time())
            self.registered.clear()
            self.ecc_volatile = 0
        elif op == "ecc":
            self.ecc_volatile += cmd["count"]
            self.ecc_aggregate += cmd["count"]
        else:
            raise ValueError(f"unknown fake NVML command {op!r}")

    def _read_control_file(self) -> None:
        if not self.control or not os.path.exists(self.control):
            return
        with open(self.control, encoding="utf-8") as control:
            control.seek(self._control_offset)
            new = control.read()
        complete = new[: new.rfind("\n") + 1]  # a line being written is read next time
        self._control_offset += len(complete.encode())
        for line in complete.splitlines():
            if line.strip():
                self._apply(json.loads(line))
        if complete:
            self._lock.notify_all()

    def _enter(self, handle: Handle | None, call: str) -> None:
        """Every API function starts here: faults are applied, then the call may hang or fail."""
        with self._lock:
            self._read_control_file()
            if not self.initialized:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            if handle is None:
                return
            self.calls[(handle.gpu, call)] += 1
            if handle.gpu in self.lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if handle.gpu in self.scenario.not_supported.get(call, ()):
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            if handle.gpu in self.scenario.failing.get(call, ()):
                raise NVMLError(NVML_ERROR_UNKNOWN)
            hang_until = self.hangs.get((handle.gpu, call), 0.0)
        remaining = hang_until - self.clock.monotonic()
        if remaining > 0:
            time.sleep(remaining)  # a hang is real: the exporter's deadline is for real threads

    def _since_driver_load(self) -> float:
        return max(self.clock.time() - self.driver_loaded_at, 0.0)

    def __getattr__(self, name: str) -> Any:
        """The calls whose answer never changes (:data:`_CONSTANTS`)."""
        if name not in _CONSTANTS:
            raise AttributeError(name)
        value = _CONSTANTS[name]

        def constant(handle: Handle) -> Any:
            self._enter(handle, name)
            return value

        return constant

    # --- library and system ---------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        with self._lock:
            self._read_control_file()
            self.calls[(-1, "nvmlInit")] += 1
            if self.scenario.no_library:
                raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
            if self.init_failures > 0:
                self.init_failures -= 1
                raise NVMLError(NVML_ERROR_DRIVER_NOT_LOADED)
            self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter(None, "nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter(None, "nvmlSystemGetDriverVersion")
        return "570.00.fake"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._enter(None, "nvmlSystemGetCudaDriverVersion")
        return 12080

    def nvmlDeviceGetCount(self) -> int:
        self._enter(None, "nvmlDeviceGetCount")
        return self.scenario.gpus

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Handle:
        self._enter(None, "nvmlDeviceGetHandleByIndex")
        if not 0 <= index < self.scenario.gpus:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return Handle(index)

    # --- identity -------------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Handle) -> str:
        self._enter(handle, "nvmlDeviceGetUUID")
        return gpu_uuid(handle.gpu) if handle.mig is None else mig_uuid(handle.gpu, handle.mig)

    def nvmlDeviceGetPciInfo(self, handle: Handle) -> SimpleNamespace:
        self._enter(handle, "nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=f"00000000:{0x18 + handle.gpu:02X}:00.0".encode())

    def nvmlDeviceGetSerial(self, handle: Handle) -> str:
        self._enter(handle, "nvmlDeviceGetSerial")
        return f"16520000{handle.gpu:05d}"

    # --- utilization and memory -----------------------------------------------------------------------

    def _now_us(self) -> int:
        return int(self.clock.time() * 1e6)

    def nvmlDeviceGetSamples(self, handle: Handle, sample_type: int, last_seen_us: int) -> tuple[int, list]:
        self._enter(handle, "nvmlDeviceGetSamples")
        now_us = self._now_us()
        first = max(last_seen_us + 1, now_us - _SAMPLE_HISTORY_US)
        first += -first % _SAMPLE_PERIOD_US
        stamps = range(first, now_us + 1, _SAMPLE_PERIOD_US)
        if not stamps:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        samples = [
            SimpleNamespace(timeStamp=t, sampleValue=SimpleNamespace(uiVal=_sample_value(t))) for t in stamps
        ]
        return NVML_VALUE_TYPE_UNSIGNED_INT, samples

    def nvmlDeviceGetUtilizationRates(self, handle: Handle) -> SimpleNamespace:
        self._enter(handle, "nvmlDeviceGetUtilizationRates")
        latest = _sample_value(self._now_us())
        return SimpleNamespace(gpu=latest, memory=latest)

    def nvmlDeviceGetMemoryInfo(self, handle: Handle, version: int | None = None) -> SimpleNamespace:
        self._enter(handle, "nvmlDeviceGetMemoryInfo")
        if handle.mig is not None:
            return SimpleNamespace(total=18 * _GIB, used=1 * _GIB, free=17 * _GIB)
        total, reserved, used = 141 * _GIB, _GIB // 2, 20 * _GIB
        if version == nvmlMemory_v2:
            return SimpleNamespace(total=total, reserved=reserved, used=used, free=total - reserved - used)
        return SimpleNamespace(total=total, used=used + reserved, free=total - reserved - used)

    # --- power, thermal, clocks -----------------------------------------------------------------------

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Handle) -> int:
        self._enter(handle, "nvmlDeviceGetTotalEnergyConsumption")
        return int(self._since_driver_load() * _POWER_MW)  # mJ at a steady draw since the driver loaded

    def nvmlDeviceGetTemperature(self, handle: Handle, sensor: int) -> int:
        self._enter(handle, "nvmlDeviceGetTemperature")
        return 45

    def nvmlDeviceGetTemperatureThreshold(self, handle: Handle, threshold: int) -> int:
        self._enter(handle, "nvmlDeviceGetTemperatureThreshold")
        return {0: 92, 1: 89, 2: 95, 3: 87}[threshold]

    def nvmlDeviceGetClockInfo(self, handle: Handle, clock: int) -> int:
        self._enter(handle, "nvmlDeviceGetClockInfo")
        return (1755, 1755, 3201, 1620)[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle: Handle, clock: int) -> int:
        self._enter(handle, "nvmlDeviceGetMaxClockInfo")
        return (1980, 1980, 3201, 1755)[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Handle) -> int:
        self._enter(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return 0x4 | (0x8 if handle.gpu in self.scenario.hw_slowdown else 0)  # sw_power_cap, hw_slowdown

    def nvmlDeviceGetFieldValues(self, handle: Handle, field_ids: list[int]) -> list[SimpleNamespace]:
        self._enter(handle, "nvmlDeviceGetFieldValues")
        supported = {_MEMORY_TEMP_FIELD: 52.0}
        supported.update(dict.fromkeys(_VIOLATION_FIELDS, 0.0))
        supported[74] = self._since_driver_load() * _THROTTLED_FRACTION * 1e9
        if handle.gpu in self.scenario.nvlink:
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

    # --- PCIe, ECC ------------------------------------------------------------------------------------

    def nvmlDeviceGetPcieThroughput(self, handle: Handle, counter: int) -> int:
        self._enter(handle, "nvmlDeviceGetPcieThroughput")
        return 2048

    def nvmlDeviceGetTotalEccErrors(self, handle: Handle, error_type: int, counter_type: int) -> int:
        self._enter(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type != 0:  # uncorrected
            return 0
        return self.ecc_volatile if counter_type == 0 else self.ecc_aggregate

    # --- NVLink, MIG, processes -----------------------------------------------------------------------

    def nvmlDeviceGetNvLinkState(self, handle: Handle, link: int) -> int:
        self._enter(handle, "nvmlDeviceGetNvLinkState")
        if handle.gpu not in self.scenario.nvlink:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if link >= _NVLINK_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return 1 if link < _NVLINK_ACTIVE else 0

    def nvmlDeviceGetMigMode(self, handle: Handle) -> list[int]:
        self._enter(handle, "nvmlDeviceGetMigMode")
        enabled = 1 if handle.gpu in self.scenario.mig else 0
        return [enabled, enabled]

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Handle, slot: int) -> Handle:
        self._enter(handle, "nvmlDeviceGetMigDeviceHandleByIndex")
        if handle.gpu not in self.scenario.mig or slot not in self.mig_slots:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return Handle(handle.gpu, slot)

    def nvmlDeviceGetGpuInstanceId(self, handle: Handle) -> int:
        self._enter(handle, "nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return handle.mig + 1

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Handle) -> list[SimpleNamespace]:
        self._enter(handle, "nvmlDeviceGetComputeRunningProcesses")
        entries = self.scenario.processes.get(handle.gpu, [])
        return [SimpleNamespace(pid=entry[0], usedGpuMemory=entry[1]) for entry in entries]

    def nvmlDeviceGetProcessUtilization(self, handle: Handle, last_seen_us: int) -> list[SimpleNamespace]:
        """One sample per busy process, stamped with the latest sample period; NOT_FOUND when none is
        newer."""
        self._enter(handle, "nvmlDeviceGetProcessUtilization")
        stamp = self._now_us() // _SAMPLE_PERIOD_US * _SAMPLE_PERIOD_US
        busy = [entry for entry in self.scenario.processes.get(handle.gpu, []) if len(entry) > 2]
        if stamp <= last_seen_us or not busy:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return [SimpleNamespace(pid=e[0], timeStamp=stamp, smUtil=e[2], memUtil=e[3]) for e in busy]


def _sample_value(timestamp_us: int) -> int:
    return _UTILIZATION_PATTERN[(timestamp_us // _SAMPLE_PERIOD_US) % len(_UTILIZATION_PATTERN)]


# --- this module as the binding of an exporter process -----------------------------------------------

_process_fake: FakeNvml | None = None


def __getattr__(name: str) -> Any:
    """pynvml's functions, answered by the process's one stand-in (made on first use from the
    environment); only names of the binding's interface are looked up here."""
    global _process_fake
    if not name.startswith(("nvml", "c_nvml")):
        raise AttributeError(name)
    if _process_fake is None:
        scenario = Scenario.from_json(json.loads(os.environ.get(SCENARIO_ENV) or "{}"))
        _process_fake = FakeNvml(scenario, control=os.environ.get(CONTROL_ENV))
    return getattr(_process_fake, name)
