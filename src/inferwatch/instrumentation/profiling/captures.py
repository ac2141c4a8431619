"""On-demand captures of the serving process: ``torch.profiler`` over the next N forward steps.

A capture is asked for from the metrics endpoint (:mod:`.http`) and taken on the thread that runs the model:
torch's profiler records the operators of the thread that starts it (its callbacks are thread-local), and must
be stopped by that thread. So the endpoint only *arms* a capture; the forward hooks
(:mod:`inferwatch.instrumentation.model.forward`, through the model's context) call :meth:`Captures.boundary`
at the start of every forward, which is where the first serving thread to get there starts the profiler, marks
each step with a ``record_function`` range (``inferwatch.step prefill 0``, ``inferwatch.step decode 1``...)
and stops it after N steps or T seconds, whichever comes first. Outside a capture the hooks pay one attribute
read (:data:`CAPTURES`'s ``armed``); nothing of torch's profiler is imported until the first capture.

What would stall a serving process is kept out of the serving thread: torch's one-time set-up of its
profiler (3 s on the development CPU) runs on the capture's own thread before it is armed; the trace is
written by torch's C++ writer and compressed on that thread; no event is parsed in the process at all
(no ``key_averages()``, 44.6 s of CPU on the H200 for one generate): the CLI reads the trace
(:mod:`inferwatch.monitor.profile_summary`). Every capture is bounded in steps, seconds, trace bytes and
files kept on disk (:class:`ProfileConfig`); file names are made here, never taken from a request.
"""

from __future__ import annotations

import contextlib
import gzip
import logging
import math
import os
import secrets
import shutil
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inferwatch.common.lograte import RateLimit
from inferwatch.instrumentation.config import from_variables, parse_bool
from inferwatch.instrumentation.profiling.files import FILE_PREFIX, prune
from inferwatch.instrumentation.profiling.memory_evidence import MEMORY, cuda_ready

log = logging.getLogger(__name__)
log.addFilter(RateLimit())

ENV_PREFIX = "INFERWATCH_PROFILE"
#: The ``record_function`` name of each captured step: ``inferwatch.step decode 3``.
STEP_PREFIX = "inferwatch.step"
# Captures whose state is kept for the endpoint's answers (the running one and the last few).
_KEPT = 8
# Bytes read and compressed at a time while a trace is compressed.
_CHUNK = 1 << 20
_VARIABLES = {
    "enabled": ENV_PREFIX,
    "directory": f"{ENV_PREFIX}_DIR",
    "max_steps": f"{ENV_PREFIX}_MAX_STEPS",
    "max_seconds": f"{ENV_PREFIX}_MAX_SECONDS",
    "max_trace_bytes": f"{ENV_PREFIX}_MAX_TRACE_BYTES",
    "max_files": f"{ENV_PREFIX}_MAX_FILES",
    "alert_interval_seconds": f"{ENV_PREFIX}_ALERT_INTERVAL_SECONDS",
    "memory_max_entries": f"{ENV_PREFIX}_MEMORY_MAX_ENTRIES",
    "oom_arm_max_seconds": f"{ENV_PREFIX}_OOM_ARM_MAX_SECONDS",
}


@dataclass(frozen=True)
class ProfileConfig:
    """Whether the endpoint takes captures, and the bounds of each (``INFERWATCH_PROFILE*`` variables)."""

    #: Captures are refused unless this is on (``INFERWATCH_PROFILE=1``).
    enabled: bool = False
    #: Where traces are written (``INFERWATCH_PROFILE_DIR``); created on the first capture.
    directory: str = field(default_factory=lambda: os.path.join(tempfile.gettempdir(), "inferwatch-profiles"))
    #: The most forward steps one capture may cover (``INFERWATCH_PROFILE_MAX_STEPS``).
    max_steps: int = 200
    #: The longest a capture may wait for its first step, and then run (``INFERWATCH_PROFILE_MAX_SECONDS``).
    max_seconds: float = 30.0
    #: The largest trace kept, uncompressed (``INFERWATCH_PROFILE_MAX_TRACE_BYTES``): a larger one is
    #: deleted and the capture fails, naming the size.
    max_trace_bytes: int = 256 * 2**20
    #: Capture files kept in the directory, the newest (``INFERWATCH_PROFILE_MAX_FILES``).
    max_files: int = 10
    #: One capture per Alertmanager alert group at most this often, in seconds
    #: (``INFERWATCH_PROFILE_ALERT_INTERVAL_SECONDS``).
    alert_interval_seconds: float = 600.0
    #: Allocator events a memory history keeps, the latest (``INFERWATCH_PROFILE_MEMORY_MAX_ENTRIES``).
    memory_max_entries: int = 100_000
    #: The longest an "arm for the next OOM" period may be (``INFERWATCH_PROFILE_OOM_ARM_MAX_SECONDS``).
    oom_arm_max_seconds: float = 3600.0

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"enabled: must be True or False, got {self.enabled!r}")
        for name in ("max_steps", "max_trace_bytes", "max_files", "memory_max_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        for name in ("max_seconds", "alert_interval_seconds", "oom_arm_max_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name}: must be a finite number > 0, got {value!r}")
        if not self.directory:
            raise ValueError("directory: must not be empty")

    @staticmethod
    def variable(name: str) -> str:
        """The environment variable of field ``name``."""
        return _VARIABLES[name]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProfileConfig:
        """The configuration from the environment; a bad value raises ValueError naming the variable."""
        return from_variables(cls, environ, cls.variable, _parse, empty_is_unset=True)


def _parse(name: str, raw: str) -> Any:
    if name == "enabled":
        return parse_bool(raw)
    if name == "directory":
        return raw
    try:
        return float(raw) if name.endswith("seconds") else int(raw)
    except ValueError:
        raise ValueError(
            f"{raw!r} is not a{'' if name.endswith('seconds') else 'n integer'} number"
        ) from None


class CaptureRefused(Exception):
    """A capture cannot be taken now; ``status`` is the HTTP status that says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Capture:
    """One capture: what was asked, where it stands, what it wrote. Its fields are read by the endpoint
    (:meth:`to_dict`) and written by the capture's thread and the serving thread."""

    id: str
    steps: int
    seconds: float
    requested_by: str
    memory: bool = False  # the allocator's history over the window, and a snapshot at its end
    state: str = "preparing"  # preparing, armed, capturing, writing, done, failed
    error: str | None = None
    thread: int | None = None  # the serving thread that took it
    captured: int = 0  # steps captured
    phases: dict[str, int] = field(default_factory=lambda: {"prefill": 0, "decode": 0})
    stopped_by: str | None = None  # steps, seconds
    created: float = field(default_factory=time.time)
    armed_at: float | None = None  # time.monotonic()
    started_at: float | None = None
    stopped_at: float | None = None
    trace_path: Path | None = None
    trace_bytes: int | None = None  # uncompressed
    trace_gzip_bytes: int | None = None
    memory_path: Path | None = None
    memory_bytes: int | None = None
    write_seconds: float | None = None
    serving_thread_seconds: float = 0.0  # time the capture took from the serving thread at boundaries
    _profiler: Any = None
    _step_range: Any = None
    #: Set when the capture is armed, waiting for a step (or ended before it could be): what a caller
    #: that starts forward steps for it waits on.
    ready: threading.Event = field(default_factory=threading.Event)
    #: Set when the serving thread stopped the profiler (or the capture ended before it could).
    stopped: threading.Event = field(default_factory=threading.Event)
    #: Set when the capture is done or failed.
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def to_dict(self) -> dict[str, Any]:
        window = None
        if self.started_at is not None and self.stopped_at is not None:
            window = self.stopped_at - self.started_at
        return {
            "id": self.id,
            "state": self.state,
            "error": self.error,
            "steps_requested": self.steps,
            "seconds_requested": self.seconds,
            "requested_by": self.requested_by,
            "steps_captured": self.captured,
            "phases": dict(self.phases),
            "stopped_by": self.stopped_by,
            "window_seconds": window,
            "trace_bytes": self.trace_bytes,
            "trace_gzip_bytes": self.trace_gzip_bytes,
            "trace_file": self.trace_path.name if self.trace_path is not None else None,
            "memory": self.memory,
            "memory_file": self.memory_path.name if self.memory_path is not None else None,
            "memory_bytes": self.memory_bytes,
            "write_seconds": self.write_seconds,
            "serving_thread_seconds": self.serving_thread_seconds,
        }


class Captures:
    """The process's captures: at most one at a time (a second is refused, never queued)."""

    def __init__(self) -> None:
        #: Read by the forward hooks at every step: True while a capture waits for, or runs on, a step.
        self.armed = False
        self._current: Capture | None = None
        self._lock = threading.Lock()
        self._history: deque[Capture] = deque(maxlen=_KEPT)

    # -- the endpoint's side ---------------------------------------------------------------------------

    def request(
        self, config: ProfileConfig, steps: int, seconds: float, requested_by: str, memory: bool = False
    ) -> Capture:
        """Start a capture of the next ``steps`` forward steps, for at most ``seconds`` (with the CUDA
        allocator's history over them: ``memory``); raises :class:`CaptureRefused` when captures are off,
        the bounds are exceeded, or one is under way."""
        if not config.enabled:
            raise CaptureRefused(403, f"profiling is off in this process: start it with {ENV_PREFIX}=1")
        if not 1 <= steps <= config.max_steps:
            raise CaptureRefused(400, f"steps must be within 1..{config.max_steps}, got {steps}")
        if not 0 < seconds <= config.max_seconds:
            raise CaptureRefused(400, f"seconds must be within (0, {config.max_seconds:g}], got {seconds:g}")
        if memory and not cuda_ready():
            raise CaptureRefused(400, "memory history needs a process that uses CUDA")
        with self._lock:
            current = self._current
            if current is not None and not current.finished:
                raise CaptureRefused(
                    409, f"capture {current.id} is under way ({current.state}): one at a time"
                )
            capture = Capture(secrets.token_hex(8), steps, seconds, requested_by, memory)
            self._current = capture
            self._history.append(capture)
        threading.Thread(
            target=self._run, args=(capture, config), name="inferwatch-profile", daemon=True
        ).start()
        return capture

    def history(self) -> list[Capture]:
        """The captures kept, oldest first."""
        with self._lock:
            return list(self._history)

    def get(self, capture_id: str | None = None) -> Capture | None:
        """The capture with this id (None: the latest), among those kept."""
        with self._lock:
            if capture_id is None:
                return self._current
            return next((c for c in self._history if c.id == capture_id), None)

    # -- the capture's own thread ------------------------------------------------------------------------

    def _run(self, capture: Capture, config: ProfileConfig) -> None:
        recording = False
        try:
            if capture.memory:
                MEMORY.start_recording(config.memory_max_entries)
                recording = True
            _detach_cupti_after_captures()
            capture._profiler = _new_profiler()
            # torch's one-time set-up of its profiler (seconds, the first time in a process) runs here, not
            # on the serving thread that starts it.
            capture._profiler.prepare_trace()
            capture.armed_at = time.monotonic()
            capture.state = "armed"
            self.armed = True
            capture.ready.set()
            if not capture.stopped.wait(capture.seconds):
                with self._lock:
                    expired = capture.state == "armed"
                    if expired:
                        self._finish(capture, "failed", f"no forward step began within {capture.seconds:g}s")
                if expired:  # no forward step began in time: nothing was started on a serving thread
                    _discard_prepared(capture._profiler)
                    return
            capture.stopped.wait()  # the serving thread stopped it
            if capture.state == "writing":
                self._write(capture, config)
        except Exception as exc:
            log.warning("profile capture %s failed: %r", capture.id, exc)
            with self._lock:
                self._finish(capture, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            capture._profiler = None
            if recording:
                with contextlib.suppress(Exception):
                    MEMORY.stop_recording()

    def _write(self, capture: Capture, config: ProfileConfig) -> None:
        started = time.monotonic()
        directory = Path(config.directory)
        directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(capture.created))
        name = f"{FILE_PREFIX}{os.getpid()}-{stamp}-{capture.id}"
        raw = directory / f".{name}.json.partial"
        final = directory / f"{name}.json.gz"
        try:
            capture._profiler.profiler.kineto_results.save(str(raw))
            size = raw.stat().st_size
            capture.trace_bytes = size
            if size > config.max_trace_bytes:
                raise CaptureRefused(
                    413,
                    f"the trace of {capture.captured} steps is {size} bytes, over the bound of "
                    f"{config.max_trace_bytes} ({ENV_PREFIX}_MAX_TRACE_BYTES): ask for fewer steps",
                )
            with raw.open("rb") as source, gzip.open(final, "wb", compresslevel=6) as sink:
                shutil.copyfileobj(source, sink, _CHUNK)
            capture.trace_gzip_bytes = final.stat().st_size
            capture.trace_path = final
            if capture.memory:
                memory = directory / f"{name}-memory.pickle"
                capture.memory_bytes = MEMORY.snapshot(memory)
                capture.memory_path = memory
            capture.write_seconds = time.monotonic() - started
            prune(directory, config.max_files)
            with self._lock:
                self._finish(capture, "done")
        except CaptureRefused as exc:
            with self._lock:
                self._finish(capture, "failed", str(exc))
        finally:
            with contextlib.suppress(OSError):
                raw.unlink()

    def _finish(self, capture: Capture, state: str, error: str | None = None) -> None:
        """Under the lock: the capture ends in ``state``; the hooks stop looking."""
        capture.state, capture.error = state, error
        if self._current is capture:
            self.armed = False
        capture.ready.set()
        capture.stopped.set()
        capture.ended.set()

    # -- the serving thread's side (from the forward hooks) -------------------------------------------------

    def boundary(self, prefill: bool) -> None:
        """A forward step begins on this thread: start, mark or stop the armed capture."""
        capture = self._current
        if capture is None:
            return
        began = time.perf_counter()
        try:
            self._boundary(capture, prefill)
        except Exception as exc:
            log.warning("profile capture %s failed at a step: %r", capture.id, exc)
            self._abandon(capture, f"{type(exc).__name__}: {exc}")
        finally:
            capture.serving_thread_seconds += time.perf_counter() - began

    def _boundary(self, capture: Capture, prefill: bool) -> None:
        me = threading.get_ident()
        if capture.state == "armed":
            with self._lock:
                if capture.state != "armed":
                    return
                capture.thread, capture.state = me, "capturing"
            capture._profiler.start_trace()
            capture.started_at = time.monotonic()
        elif capture.state != "capturing" or capture.thread != me:
            return
        else:
            _close_range(capture)
            if capture.captured >= capture.steps:
                self._stop(capture, "steps")
                return
            if time.monotonic() - capture.started_at >= capture.seconds:
                self._stop(capture, "seconds")
                return
        phase = "prefill" if prefill else "decode"
        capture._step_range = _open_range(f"{STEP_PREFIX} {phase} {capture.captured}")
        capture.captured += 1
        capture.phases[phase] += 1

    def generate_ended(self) -> None:
        """A ``generate`` returned on this thread: its last step ends here (not at the next request's first
        forward, which may come much later), and a capture past its time ends with it. One with steps and
        time left goes on into the thread's next request."""
        capture = self._current
        if capture is None or capture.state != "capturing" or capture.thread != threading.get_ident():
            return
        try:
            _close_range(capture)
            if time.monotonic() - capture.started_at >= capture.seconds:
                self._stop(capture, "seconds")
        except Exception as exc:
            log.warning("profile capture %s failed at the end of a request: %r", capture.id, exc)
            self._abandon(capture, f"{type(exc).__name__}: {exc}")

    def _stop(self, capture: Capture, why: str) -> None:
        capture.stopped_by = why
        capture._profiler.stop_trace()
        capture.stopped_at = time.monotonic()
        with self._lock:
            capture.state = "writing"
            self.armed = False
            capture.stopped.set()

    def _abandon(self, capture: Capture, error: str) -> None:
        """A failure on the serving thread: stop whatever was started there, record the failure."""
        if capture._step_range is not None:
            with contextlib.suppress(Exception):
                _close_range(capture)
        if capture.state == "capturing" and capture.thread == threading.get_ident():
            with contextlib.suppress(Exception):
                capture._profiler.stop_trace()
        with self._lock:
            self._finish(capture, "failed", error)


def _new_profiler() -> Any:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if cuda_ready():
        activities.append(ProfilerActivity.CUDA)
    # No shapes, stacks or memory: each multiplies the trace; acc_events off: nothing is kept after it.
    return profile(activities=activities, record_shapes=False, with_stack=False, profile_memory=False)


#: The variable that tells torch's profiler library (kineto) to detach CUPTI when a trace stops.
TEARDOWN_VARIABLE = "TEARDOWN_CUPTI"


def _detach_cupti_after_captures() -> None:
    """Have kineto detach CUPTI (``cuptiFinalize``) when a capture stops. Kineto leaves it attached unless
    told: CUPTI's callbacks then stay on every kernel launch for the life of the process (an H100's 1B
    eager decode ran at 0.71 of its speed from 5 s to 45 s after one 20-step capture: docs/profiling.md,
    "What a capture costs"). A value the user set is kept, and one that keeps CUPTI attached is said once."""
    value = os.environ.setdefault(TEARDOWN_VARIABLE, "1")
    if value != "1":
        log.warning(
            "%s=%s: CUPTI stays attached after a profile capture ends, and every kernel launch pays for it "
            "until the process exits; unset it to have captures leave no cost",
            TEARDOWN_VARIABLE,
            value,
        )


def _discard_prepared(profiler: Any) -> None:
    """Release a profiler that was prepared but never started: started and stopped here, empty."""
    with contextlib.suppress(Exception):
        profiler.start_trace()
        profiler.stop_trace()


def _open_range(name: str) -> Any:
    import torch

    return torch.ops.profiler._record_function_enter_new(name, None)


def _close_range(capture: Capture) -> None:
    import torch

    handle, capture._step_range = capture._step_range, None
    if handle is not None:
        torch.ops.profiler._record_function_exit._RecordFunction(handle)


#: The process's captures: the endpoint arms them, the forward hooks take them.
CAPTURES = Captures()
