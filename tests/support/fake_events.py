"""XID events in the NVML stand-in (:class:`tests.support.fake_nvml.FakeNvml` inherits them): a GPU
registered for events gets the XIDs that the ``xid`` command queues, through ``nvmlEventSetWait_v2``."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from tests.support.fake_nvml_types import NVML_ERROR_TIMEOUT, NVML_ERROR_UNINITIALIZED, Handle, NVMLError

nvmlEventTypeXidCriticalError = 0x8


class EventsApi:
    """pynvml's event functions, over the state of the stand-in they belong to."""

    events: list[tuple[int, int]]
    registered: set[int]
    initialized: bool
    _lock: Any

    def _enter(self, handle: Any, call: str) -> None:
        raise NotImplementedError

    def _read_control_file(self) -> None:
        raise NotImplementedError

    def nvmlEventSetCreate(self) -> object:
        self._enter(None, "nvmlEventSetCreate")
        return object()

    def nvmlDeviceRegisterEvents(self, handle: Handle, event_types: int, event_set: object) -> None:
        self._enter(handle, "nvmlDeviceRegisterEvents")
        with self._lock:
            self.registered.add(handle.gpu)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> SimpleNamespace:
        # Real time: the XID thread waits on this as on the driver, whatever clock the test drives.
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            while True:
                self._read_control_file()
                if not self.initialized:
                    raise NVMLError(NVML_ERROR_UNINITIALIZED)
                for i, (gpu, xid) in enumerate(self.events):
                    if gpu in self.registered:
                        del self.events[i]
                        return SimpleNamespace(
                            device=Handle(gpu), eventType=nvmlEventTypeXidCriticalError, eventData=xid
                        )
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise NVMLError(NVML_ERROR_TIMEOUT)
                self._lock.wait(min(remaining, 0.05))  # also re-reads the control file while waiting

    def nvmlEventSetFree(self, event_set: object) -> None:
        return None
