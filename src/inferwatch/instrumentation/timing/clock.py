"""Clocks that say when device work *finished*, without ever waiting for it.

A host clock read right after launching CUDA kernels measures the launch, not the work (docs/timing.md).
Both clocks here share one interface, so the request and forward timing code is the same on CPU and GPU:

* :meth:`Clock.start` takes a host ``perf_counter`` reading at the start of a request, plus, on CUDA, an
  *anchor*: an event recorded at the same moment on an idle side stream. The anchor completes almost at
  once, so its device timestamp names the same instant as the host reading, and every later event can be
  placed on the host clock as ``anchor.host + anchor.event.elapsed_time(event)``.
* :meth:`Clock.mark` records a point in the device's work queue (the current stream, or a given one
  with :meth:`Clock.mark_on`, or one fixed by :meth:`Clock.marker`): an event on CUDA,
  a ``perf_counter`` reading on CPU, where work is synchronous and the reading *is* the completion time.
* :meth:`Clock.ready` asks, without blocking, whether that point has been reached (``event.query()``).
* :meth:`Clock.spans` resolves marks recorded in pairs around steps, all at once: each pair's duration and
  its end on the host clock.
* :meth:`Clock.fetch` copies a small device tensor to the host asynchronously (pinned memory + event), so
  values such as token counts are read once the device has produced them, never by stalling the caller.

Nothing here calls ``synchronize()``, ``.item()``, ``.cpu()`` or a blocking copy on a device tensor.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch


@dataclass(frozen=True)
class Anchor:
    """A host ``perf_counter`` reading and, on CUDA, the event that marks the same instant on the device."""

    host: float
    event: Any = None


class Fetched(Protocol):
    """A device value on its way to the host."""

    def ready(self) -> bool: ...

    def value(self) -> list[int]: ...


class Known:
    """A value that was host-readable without waiting (CPU tensors, figures the host already has)."""

    __slots__ = ("_value",)

    def __init__(self, value: list[int]) -> None:
        self._value = value

    def ready(self) -> bool:
        return True

    def value(self) -> list[int]:
        return self._value


class _PinnedCopy:
    """An asynchronous device-to-host copy into pinned memory, complete when its event is.

    The event comes from the clock's pool (creating one is a driver call) and goes back when the value
    is read, which is why :meth:`value` is called once."""

    __slots__ = ("_clock", "_event", "_host")

    def __init__(self, tensor: torch.Tensor, clock: CudaClock) -> None:
        self._host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        self._host.copy_(tensor, non_blocking=True)
        self._clock = clock
        self._event = clock.mark()

    def ready(self) -> bool:
        return self._event.query()

    def value(self) -> list[int]:
        self._clock.release(self._event)
        return self._host.tolist()  # a host tensor: no device access


class Clock(Protocol):
    """When work on one device was done, on the host's ``perf_counter`` timeline."""

    device: torch.device

    def start(self) -> Anchor: ...

    def mark(self) -> Any: ...

    def marker(self) -> Callable[[], Any]: ...

    def mark_on(self, stream: Any) -> Any: ...

    def ready(self, mark: Any) -> bool: ...

    def host_time(self, anchor: Anchor, mark: Any) -> float: ...

    def elapsed(self, earlier: Any, later: Any) -> float: ...

    def spans(self, anchor: Anchor, marks: list[Any]) -> tuple[list[float], list[float]]: ...

    def release(self, mark: Any) -> None: ...

    def release_all(self, marks: list[Any]) -> None: ...

    def fetch(self, tensor: torch.Tensor) -> Fetched: ...


class HostClock:
    """CPU (and any synchronous device): a host reading taken when the work returns is its completion."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None else torch.device("cpu")

    def start(self) -> Anchor:
        return Anchor(time.perf_counter())

    def mark(self) -> float:
        return time.perf_counter()

    def marker(self) -> Callable[[], float]:
        return time.perf_counter

    def mark_on(self, stream: Any) -> float:
        return time.perf_counter()

    def ready(self, mark: float) -> bool:
        return True

    def host_time(self, anchor: Anchor, mark: float) -> float:
        return mark

    def elapsed(self, earlier: float, later: float) -> float:
        return later - earlier

    def spans(self, anchor: Anchor, marks: list[float]) -> tuple[list[float], list[float]]:
        return [marks[i + 1] - marks[i] for i in range(0, len(marks), 2)], marks[1::2]

    def release(self, mark: float) -> None:
        pass

    def release_all(self, marks: list[float]) -> None:
        pass

    def fetch(self, tensor: torch.Tensor) -> Fetched:
        return Known(tensor.tolist())


#: ``torch.cuda.Event.record`` without its Python layer (which only fills in the current stream, given
#: here); the public method where torch has no such base class.
_record = getattr(getattr(torch._C, "_CudaEventBase", None), "record", None) or torch.cuda.Event.record
#: ``torch.cuda.Event.elapsed_time`` without its Python layer, likewise (milliseconds).
_elapsed_ms = (
    getattr(getattr(torch._C, "_CudaEventBase", None), "elapsed_time", None) or torch.cuda.Event.elapsed_time
)


class CudaClock:
    """CUDA events on the current stream of one device, pooled, resolved with non-blocking queries."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # Events are reused once resolved: creating one is a driver call we keep off the hot path.
        self._pool: collections.deque[torch.cuda.Event] = collections.deque()
        self._side_stream: torch.cuda.Stream | None = None
        self._index = device.index if device.index is not None else torch.cuda.current_device()
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._lock = threading.Lock()

    def _event(self) -> torch.cuda.Event:
        try:
            return self._pool.pop()
        except IndexError:
            return torch.cuda.Event(enable_timing=True)

    def _anchor_stream(self) -> torch.cuda.Stream:
        # A stream nothing else uses: an event recorded on it does not queue behind the model's work, so
        # it completes right away and its timestamp names "now". torch's pooled streams are created
        # non-blocking, so they do not wait on the legacy default stream either.
        if self._side_stream is None:
            with self._lock:
                if self._side_stream is None:
                    self._side_stream = torch.cuda.Stream(self.device)
        return self._side_stream

    def start(self) -> Anchor:
        event = self._event()
        event.record(self._anchor_stream())
        return Anchor(time.perf_counter(), event)

    def mark(self) -> torch.cuda.Event:
        # Called two or three times per decode step, so the pool, the stream and the record are inlined
        # (one Python frame instead of four; hook_cost.py on the H200). torch.cuda.current_stream() builds
        # a new Stream object through several Python layers on every call; the raw handle is one C call,
        # and the Stream object for a handle never changes, so it is built once.
        try:
            event = self._pool.pop()
        except IndexError:
            event = torch.cuda.Event(enable_timing=True)
        raw = torch._C._cuda_getCurrentRawStream(self._index)
        stream = self._streams.get(raw)
        if stream is None:
            stream = self._streams[raw] = torch.cuda.current_stream(self.device)
        _record(event, stream)
        return event

    def marker(self) -> Callable[[], torch.cuda.Event]:
        """:meth:`mark` bound to the current stream, for a caller that records many marks in a row there
        (a request's compiled decode steps: generate does not change streams between them). The one
        frame left of a mark, which is about all a compiled decode step costs (docs/timing.md)."""
        pool, stream = self._pool, torch.cuda.current_stream(self.device)

        def mark() -> torch.cuda.Event:
            try:
                event = pool.pop()
            except IndexError:
                event = torch.cuda.Event(enable_timing=True)
            _record(event, stream)
            return event

        return mark

    def mark_on(self, stream: torch.cuda.Stream | None) -> torch.cuda.Event:
        """A mark on ``stream`` (the current stream when None): work queued on a stream of its own, like
        continuous batching's compute stream, is timed there."""
        if stream is None:
            return self.mark()
        event = self._event()
        event.record(stream)
        return event

    def ready(self, mark: torch.cuda.Event) -> bool:
        return mark.query()

    def host_time(self, anchor: Anchor, mark: torch.cuda.Event) -> float:
        return anchor.host + anchor.event.elapsed_time(mark) / 1e3

    def elapsed(self, earlier: torch.cuda.Event, later: torch.cuda.Event) -> float:
        return earlier.elapsed_time(later) / 1e3

    def spans(self, anchor: Anchor, marks: list[torch.cuda.Event]) -> tuple[list[float], list[float]]:
        # Two elapsed_time calls per pair are most of what resolving a compiled decode step costs: no
        # Python frame around them (hook_cost.py --static on the H200).
        reference, host, elapsed_ms = anchor.event, anchor.host, _elapsed_ms
        durations = [elapsed_ms(marks[i], marks[i + 1]) / 1e3 for i in range(0, len(marks), 2)]
        ends = [host + elapsed_ms(reference, marks[i]) / 1e3 for i in range(1, len(marks), 2)]
        return durations, ends

    def release(self, mark: Any) -> None:
        event = mark.event if isinstance(mark, Anchor) else mark
        if event is not None:
            self._pool.append(event)

    def release_all(self, marks: list[torch.cuda.Event]) -> None:
        self._pool.extend(marks)

    def fetch(self, tensor: torch.Tensor) -> Fetched:
        return _PinnedCopy(tensor, self)


_clocks: dict[torch.device, Clock] = {}
_clocks_lock = threading.Lock()


def clock_for(device: torch.device | str | None) -> Clock:
    """The shared clock of ``device``: CUDA events on CUDA, the host clock everywhere else."""
    device = torch.device("cpu") if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    clock = _clocks.get(device)
    if clock is None:
        with _clocks_lock:
            clock = _clocks.get(device)
            if clock is None:
                clock = CudaClock(device) if device.type == "cuda" else HostClock(device)
                _clocks[device] = clock
    return clock
