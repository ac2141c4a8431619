"""Why clocks are below their maximum: one 0/1 series per reason, and cumulative time per reason.

The 0/1 series (``gpu_clocks_event_active``) shows the reasons active at the moment of the poll, one series
per bit of the reasons mask the GPU supports, so none is a sticky last value. A poll only samples the
moment, and a 200 ms power-brake episode between two polls leaves no trace there; NVML's violation counters
do not miss it: they accumulate the nanoseconds spent in each state, exported as
``gpu_clocks_event_seconds_total``, whose ``rate()`` is the fraction of time clocks were held back.
"""

from __future__ import annotations

from ..nvml import GpuContext
from ..samples import gpu_counter, gpu_gauge
from .registry import Registration, register

CLOCKS_EVENT_ACTIVE = gpu_gauge(
    "gpu_clocks_event_active",
    "1 while the reason holds clocks below maximum (throttling), else 0; a series per supported reason.",
    "reason",
)
CLOCKS_EVENT_SECONDS = gpu_counter(
    "gpu_clocks_event_seconds_total",
    "Cumulative time clocks were held back for the reason (NVML violation counters).",
    "reason",
)

# Bits of nvmlClocksEventReasons (nvml.h).
_REASON_BITS = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
_ALL_BITS = sum(bit for bit, _ in _REASON_BITS)
# NVML field ids of the violation counters, in nanoseconds (NVML_FI_DEV_PERF_POLICY_* and
# NVML_FI_DEV_CLOCKS_EVENT_REASON_*). Board limit, low utilization and reliability have no mask bit.
_REASON_FIELDS = (
    (74, "sw_power_cap"),
    (76, "sync_boost"),
    (77, "board_limit"),
    (78, "low_utilization"),
    (79, "reliability"),
    (269, "sw_thermal_slowdown"),
    (270, "hw_thermal_slowdown"),
    (271, "hw_power_brake_slowdown"),
)
_FIELD_IDS = [field_id for field_id, _ in _REASON_FIELDS]
_NS = 1e-9
# The "throttle" names are the pre-R535 spellings, still the only ones older drivers export.
_CURRENT_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
_SUPPORTED_CALLS = ("nvmlDeviceGetSupportedClocksEventReasons", "nvmlDeviceGetSupportedClocksThrottleReasons")


class ClocksEventsCollector:
    name = "clocks_events"

    def collect(self, gpu: GpuContext) -> None:
        current = gpu.read_first(_CURRENT_CALLS)
        if current is not None:
            supported = gpu.device.cache.get("clocks_events.supported")
            if supported is None:
                supported = gpu.read_first(_SUPPORTED_CALLS)
                supported = _ALL_BITS if supported is None else supported
                gpu.device.cache["clocks_events.supported"] = supported
            for bit, reason in _REASON_BITS:
                if supported & bit:
                    gpu.emit(CLOCKS_EVENT_ACTIVE, 1 if current & bit else 0, reason)
        nanoseconds = gpu.read_fields(_FIELD_IDS)
        for field_id, reason in _REASON_FIELDS:
            if field_id in nanoseconds:
                gpu.emit(CLOCKS_EVENT_SECONDS, nanoseconds[field_id] * _NS, reason)


register(
    Registration(
        "clocks_events",
        "why clocks are below their maximum (throttle reasons), and for how long",
        gpu=lambda config, settings, shared: [ClocksEventsCollector()],
    )
)
