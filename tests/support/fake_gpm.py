"""GPM in the NVML stand-in (:class:`tests.support.fake_nvml.FakeNvml` inherits it), for its fault
paths: samples live in buffers that must be freed, metrics of two samples 100 ms apart or less (on the
stand-in's clock) are NaN as on a real GPU, and the values otherwise are the constants of
:data:`GPM_VALUES`, not a model of a GPU."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from tests.support.fake_nvml_types import (
    NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED,
    NVML_SUCCESS,
    Handle,
    NVMLError,
)

_GPM_MIN_SECONDS = 0.1
NVML_GPM_METRIC_MAX = 477
# GPM metric id -> value (percent, or MiB/s), for the whole GPU; a GPU instance gets half of each.
GPM_VALUES = {1: 70.0, 2: 60.0, 3: 25.0, 5: 45.0, 10: 30.0, 11: 0.0, 12: 10.0, 13: 5.0, 20: 100.0, 21: 200.0}
_GPM_NVLINK_VALUES = {60: 1000.0, 61: 1500.0}  # GPUs with NVLink only


@dataclass
class GpmSample:
    gpu: int | None = None
    instance: int | None = None
    taken_at: float = 0.0


class c_nvmlGpmMetricsGet_t:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: GpmSample | None = None
        self.sample2: GpmSample | None = None
        self.metrics = [
            SimpleNamespace(metricId=0, nvmlReturn=NVML_SUCCESS, value=0.0)
            for _ in range(NVML_GPM_METRIC_MAX)
        ]


class GpmApi:
    """pynvml's GPM functions, over the state of the :class:`~tests.support.fake_nvml.FakeNvml` they
    belong to (its scenario, clock, lock and the set of live sample buffers)."""

    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
    scenario: Any
    clock: Any
    gpm_buffers: set[int]
    mig_slots: list[int]
    _lock: Any

    def _enter(self, handle: Any, call: str) -> None:
        raise NotImplementedError

    def gpm_buffers_live(self) -> int:
        """Sample buffers allocated and not freed: 0 once an exporter has stopped."""
        with self._lock:
            return len(self.gpm_buffers)

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> SimpleNamespace:
        self._enter(handle, "nvmlGpmQueryDeviceSupport")
        return SimpleNamespace(version=1, isSupportedDevice=0 if handle.gpu in self.scenario.no_gpm else 1)

    def nvmlGpmSampleAlloc(self) -> GpmSample:
        self._enter(None, "nvmlGpmSampleAlloc")
        sample = GpmSample()
        with self._lock:
            self.gpm_buffers.add(id(sample))
        return sample

    def nvmlGpmSampleFree(self, sample: GpmSample) -> None:
        # Host memory going back: unlike the other calls, answered while the library is uninitialised too.
        with self._lock:
            if id(sample) not in self.gpm_buffers:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)  # freed twice, or never allocated
            self.gpm_buffers.discard(id(sample))

    def _gpm_sample(self, handle: Any, instance: int | None, sample: GpmSample) -> GpmSample:
        if handle.gpu in self.scenario.no_gpm:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if id(sample) not in self.gpm_buffers:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        sample.gpu, sample.instance, sample.taken_at = handle.gpu, instance, self.clock.monotonic()
        return sample

    def nvmlGpmSampleGet(self, handle: Any, sample: GpmSample) -> GpmSample:
        self._enter(handle, "nvmlGpmSampleGet")
        return self._gpm_sample(handle, None, sample)

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance: int, sample: GpmSample) -> GpmSample:
        self._enter(handle, "nvmlGpmMigSampleGet")
        if handle.gpu not in self.scenario.mig or gpu_instance - 1 not in self.mig_slots:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._gpm_sample(handle, gpu_instance, sample)

    def nvmlGpmMetricsGet(self, request: c_nvmlGpmMetricsGet_t) -> c_nvmlGpmMetricsGet_t:
        first, second = request.sample1, request.sample2
        if first is None or second is None or first.gpu is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if (first.gpu, first.instance) != (second.gpu, second.instance):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        self._enter(Handle(first.gpu), "nvmlGpmMetricsGet")
        too_close = second.taken_at - first.taken_at <= _GPM_MIN_SECONDS
        values = dict(GPM_VALUES)
        if first.gpu in self.scenario.nvlink and first.instance is None:
            values.update(_GPM_NVLINK_VALUES)
        for metric in request.metrics[: request.numMetrics]:
            value = values.get(metric.metricId)
            metric.nvmlReturn = NVML_SUCCESS if value is not None else NVML_ERROR_NOT_SUPPORTED
            if too_close or first.gpu in self.scenario.gpm_nan:
                value = float("nan")
            metric.value = (value or 0.0) / (1 if first.instance is None else 2)
        return request
