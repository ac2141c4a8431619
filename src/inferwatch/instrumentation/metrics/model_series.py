"""One model's series: the catalogue's children bound to its ``model`` label, plus running sums.

Binding the label once keeps ``labels()`` lookups out of the hot path. The running sums (live KV-cache
bytes of in-flight requests, and forward work in the current poll window) are shared by every thread that
serves the model, so they are kept under a lock; the background sampler turns the window into gauges.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Gauge

from inferwatch.instrumentation.metrics import catalogue as cat
from inferwatch.instrumentation.metrics.catalogue import Metrics
from inferwatch.instrumentation.metrics.observations import Observations, observe_many
from inferwatch.instrumentation.metrics.vocabulary import (
    BUSY_SOURCES,
    FINISH_REASONS,
    KV_BLOCK_STATES,
    OUTCOMES,
    PHASES,
    STATUSES,
    STEP_TOKEN_KINDS,
    ForwardPhase,
)

#: The heartbeat answers "has the engine stalled for seconds?"; writing the gauge on every forward cost
#: ~18 µs a step on the CPU (docs/benchmarks.md) for a resolution nobody alerts on.
HEARTBEAT_RESOLUTION_SECONDS = 0.1


@dataclass(frozen=True)
class KVCacheSize:
    """What one request's KV cache holds on the device (model.kvcache measures it from shapes)."""

    bytes: int
    #: Bytes one cached token of one sequence takes, over all layers, keys and values.
    bytes_per_token: float
    #: Preallocated token slots (static caches: max_cache_len x batch); None for growing caches.
    capacity_tokens: int | None


@dataclass
class Window:
    """Forward work on one device since the sampler last looked."""

    forward_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_bytes: float = 0.0
    prefill_seconds: float = 0.0
    prefill_flops: float = 0.0


@dataclass
class _LiveTotals:
    bytes: float = 0.0
    capacity_tokens: float = 0.0
    bytes_per_token: float | None = None
    windows: dict[str, Window] = field(default_factory=dict)


class ModelSeries:
    """The series of one ``model`` label on one registry (shared by every instrumentation using it)."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self.name = name
        self.metrics = metrics
        self.errors = metrics.errors

        def bind(spec: cat.MetricSpec, *extra: str):
            return metrics[spec].labels(name, *extra)

        self.ttft = bind(cat.TTFT)
        self.itl = bind(cat.ITL)
        self.tpot = bind(cat.TPOT)
        self.max_itl = bind(cat.MAX_ITL)
        self.e2e = bind(cat.E2E, "ok")  # a served request's; a cancelled one's once there is one
        self._e2e_by_outcome: dict[str, Any] = {"ok": self.e2e}
        self.prefill = bind(cat.PREFILL)
        self.decode = bind(cat.DECODE)
        self.queue = bind(cat.QUEUE)
        self.forward = {phase: bind(cat.FORWARD, phase) for phase in PHASES}
        self.step_tokens = {kind: bind(cat.STEP_TOKENS, kind) for kind in STEP_TOKEN_KINDS}
        self.prompt_tokens_hist = bind(cat.PROMPT_TOKENS_HIST)
        self.generation_tokens_hist = bind(cat.GENERATION_TOKENS_HIST)
        self.batch_size = bind(cat.BATCH_SIZE)
        self.requests = {status: bind(cat.REQUESTS, status) for status in STATUSES}
        self.finished = {reason: bind(cat.FINISHED, reason) for reason in FINISH_REASONS}
        self.wasted_tokens = bind(cat.WASTED_TOKENS)
        # What the server sent (the middleware's): series once a middleware observes one, so a model
        # served without it does not show empty histograms.
        self._responses: tuple[Any, Any] | None = None
        self._socket_wait: Any = None
        self.prompt_tokens = bind(cat.PROMPT_TOKENS)
        self.generation_tokens = bind(cat.GENERATION_TOKENS)
        self.oom_events = bind(cat.OOM_EVENTS)
        self.running = bind(cat.REQUESTS_RUNNING)
        self.oldest_running_age = bind(cat.OLDEST_RUNNING_AGE)
        #: Running requests' start times (perf_counter: arrival or entry), by a key of the caller's: plain
        #: floats, so a request (and its tensors) is never kept alive here; as many as llm_requests_running.
        self._running_since: dict[Hashable, float] = {}
        # The scraping process of multiprocess mode reads files, so scrape-time callbacks never run here:
        # the age is written whenever this process has a reason to (see refresh_running_age_between_scrapes).
        self._multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.waiting = bind(cat.REQUESTS_WAITING)
        self.kv_bytes = bind(cat.KV_CACHE_BYTES)
        self.kv_capacity = bind(cat.KV_CACHE_CAPACITY_TOKENS)
        self.kv_preemptions = bind(cat.KV_CACHE_PREEMPTIONS)
        #: The paged KV cache of the model's continuous batching (paged.PagedCacheView), if any.
        self._paged_cache: Any = None
        #: Bytes of the paged cache in use at the sampler's last reading: what a decode step reads of it.
        self.paged_used_bytes = 0.0
        #: Its prefix cache's lookups, in prompt tokens: (hit, miss), bound with the first cache that shares.
        self._prefix_tokens: tuple[Any, Any] | None = None
        # Gauges without a meaningful zero get their series on the first real value, so a model that has
        # not stepped yet does not claim a heartbeat at 1970 or 0 bytes per token.
        self._kv_bytes_per_token: Gauge | None = None
        self._last_step: Gauge | None = None
        self._last_beat = 0.0
        self._lock = threading.Lock()
        self._totals = _LiveTotals()

    def begin_running(self, key: Hashable, since: float) -> None:
        """The request known by ``key`` runs from now on, since ``since`` (perf_counter: its arrival at
        the server where known, else its entry): counted in llm_requests_running, its age in
        llm_request_oldest_running_age_seconds. Once per key until :meth:`end_running`."""
        with self._lock:
            if key in self._running_since:
                return
            self._running_since[key] = since
            self.running.inc()
        self.refresh_running_age_between_scrapes()

    def running_since(self, key: Hashable, since: float) -> None:
        """The running request known by ``key`` started earlier than it said: at ``since``."""
        with self._lock:
            if key in self._running_since:
                self._running_since[key] = since

    def end_running(self, key: Hashable) -> None:
        """The request known by ``key`` stopped running (ended, or went back to waiting)."""
        with self._lock:
            if self._running_since.pop(key, None) is None:
                return
            self.running.dec()
        self.refresh_running_age_between_scrapes()

    def refresh_running_age(self, now: float | None = None) -> None:
        """Set the oldest running request's age as of ``now`` (perf_counter; default: now); 0 when none
        runs, so that "no request" is a value an alert compares against, not a missing series."""
        if now is None:
            now = time.perf_counter()
        with self._lock:  # the set and the gauge change together: a concurrent end cannot be undone
            oldest = min(self._running_since.values(), default=None)
            self.oldest_running_age.set(0.0 if oldest is None else max(0.0, now - oldest))

    def refresh_running_age_between_scrapes(self) -> None:
        """In multiprocess mode only, where no scrape reaches this process: refresh the age now (at
        starts and ends, heartbeats and polls); a scrape does it otherwise."""
        if self._multiprocess:
            self.refresh_running_age()

    def update_kv(self, old: KVCacheSize | None, new: KVCacheSize | None) -> None:
        """Replace one request's contribution to the live KV-cache totals."""
        with self._lock:
            totals = self._totals
            if old is not None:
                totals.bytes -= old.bytes
                totals.capacity_tokens -= old.capacity_tokens or 0
            if new is not None:
                totals.bytes += new.bytes
                totals.capacity_tokens += new.capacity_tokens or 0
                totals.bytes_per_token = new.bytes_per_token
            kv_bytes, capacity, per_token = totals.bytes, totals.capacity_tokens, totals.bytes_per_token
        self.kv_bytes.set(kv_bytes)
        self.kv_capacity.set(capacity)
        if per_token is not None:
            if self._kv_bytes_per_token is None:
                self._kv_bytes_per_token = self.metrics[cat.KV_CACHE_BYTES_PER_TOKEN].labels(self.name)
            self._kv_bytes_per_token.set(per_token)

    def e2e_for(self, status: str) -> Any:
        """The end-to-end latency histogram of a request that ended with ``status``, or None where the
        status has none (an error, an OOM: no outcome the user waited for)."""
        e2e = self._e2e_by_outcome.get(status)
        if e2e is None and status in OUTCOMES:
            e2e = self._e2e_by_outcome[status] = self.metrics[cat.E2E].labels(self.name, status)
        return e2e

    def observe_response(
        self, first_content: float | None, last_byte: float | None, ttft: bool = False
    ) -> None:
        """A response the middleware watched: seconds from the arrival to its first content byte and to its
        last byte, where it had them. ``ttft``: the first of them (the first content, else the last byte) is
        also the request's time to first token, as its client got it."""
        if self._responses is None:
            self._responses = (
                self.metrics[cat.RESPONSE_FIRST_CONTENT].labels(self.name),
                self.metrics[cat.RESPONSE_LAST_BYTE].labels(self.name),
            )
        first, last = self._responses
        if first_content is not None:
            first.observe(first_content)
        if last_byte is not None:
            last.observe(last_byte)
        if ttft:
            self.ttft.observe(last_byte if first_content is None else first_content)

    def observe_socket_wait(self, seconds: float) -> None:
        """A request the middleware saw ``seconds`` after the kernel had received it."""
        if self._socket_wait is None:
            self._socket_wait = self.metrics[cat.SOCKET_WAIT].labels(self.name)
        self._socket_wait.observe(seconds)

    def heartbeat(self) -> None:
        """A forward or token step happened now (recorded at most every HEARTBEAT_RESOLUTION_SECONDS)."""
        now = time.time()
        if now - self._last_beat < HEARTBEAT_RESOLUTION_SECONDS:
            return
        self._last_beat = now
        self.refresh_running_age_between_scrapes()
        if self._last_step is None:
            self._last_step = self.metrics[cat.LAST_STEP].labels(self.name)
        self._last_step.set(now)

    @property
    def bytes_per_token(self) -> float | None:
        return self._totals.bytes_per_token

    def add_forwards(
        self, device: str, phase: ForwardPhase, durations: list[float], read_bytes: float, flops: float
    ) -> None:
        """Account resolved forwards of one phase on one device: ``read_bytes`` is what the decode steps
        among them read, ``flops`` what the prefills computed; a mixed step counts in the busy time only
        (its work is neither a prefill's nor a decode's)."""
        histogram = self.forward.get(phase)
        if histogram is None:
            histogram = self.forward[phase] = self.metrics[cat.FORWARD].labels(self.name, phase)
        observe_many(histogram, durations)
        seconds = sum(durations)
        with self._lock:
            window = self._totals.windows.get(device)
            if window is None:
                window = self._totals.windows[device] = Window()
            window.forward_seconds += seconds
            if phase == "decode":
                window.decode_seconds += seconds
                window.decode_bytes += read_bytes
            elif phase == "prefill":
                window.prefill_seconds += seconds
                window.prefill_flops += flops

    def watch_paged_cache(self, view: Any) -> None:
        """Have the sampler report ``view``'s blocks, bytes, capacity and headroom from now on; a cache that
        shares prefixes has its lookup counters from now on too (at 0 until its first lookup)."""
        self._paged_cache = view
        if view.prefix_sharing:
            self._prefix_lookups()

    def _prefix_lookups(self) -> tuple[Any, Any]:
        if self._prefix_tokens is None:
            family = self.metrics[cat.KV_CACHE_PREFIX_TOKENS]
            self._prefix_tokens = (family.labels(self.name, "hit"), family.labels(self.name, "miss"))
        return self._prefix_tokens

    def count_prefix_lookups(self, hit: int, miss: int) -> None:
        """Prompt tokens looked up in the paged cache's prefix cache: found there (``hit``) or not."""
        hits, misses = self._prefix_lookups()
        hits.inc(hit)
        misses.inc(miss)

    def poll_paged_cache(self) -> bool:
        """Read the paged cache into the KV gauges; False when the model has none (any more)."""
        view = self._paged_cache
        if view is None:
            return False
        reading = view.read()
        if reading is None:  # the batch processor and its cache are gone
            self._paged_cache = None
            for state in KV_BLOCK_STATES:
                drop_gauge(self.metrics[cat.KV_CACHE_BLOCKS], self.name, state)
            drop_gauge(self.metrics[cat.KV_CACHE_CAPACITY_BYTES], self.name)
            return False
        blocks = self.metrics[cat.KV_CACHE_BLOCKS]
        blocks.labels(self.name, "used").set(round(reading.used_bytes / view.block_bytes))
        blocks.labels(self.name, "prefix_cached").set(round(reading.prefix_cached_bytes / view.block_bytes))
        blocks.labels(self.name, "total").set(view.total_blocks)
        self.paged_used_bytes = reading.used_bytes
        self.kv_bytes.set(reading.used_bytes)
        self.kv_capacity.set(view.capacity_tokens)
        self.metrics[cat.KV_CACHE_CAPACITY_BYTES].labels(self.name).set(view.capacity_bytes)
        # Prefix-cached blocks are room too: transformers gives them to a request that needs it.
        available = view.capacity_bytes - reading.used_bytes
        self.metrics[cat.KV_CACHE_HEADROOM_TOKENS].labels(self.name).set(available // view.bytes_per_token)
        self.metrics[cat.KV_CACHE_BYTES_PER_TOKEN].labels(self.name).set(view.bytes_per_token)
        return True

    def settle_request_tokens(
        self,
        prompt: float,
        generated: float,
        counted_prompt: float,
        counted_generated: float,
        observations: Observations,
    ) -> None:
        """A finished request's exact prompt and generated tokens: the per-request histograms, and the part
        of them the counters have not counted while it ran (its live counts are lower bounds: a counter
        never goes back)."""
        observations.count(self.prompt_tokens, max(0.0, prompt - counted_prompt))
        observations.observe(self.prompt_tokens_hist, prompt)
        observations.count(self.generation_tokens, max(0.0, generated - counted_generated))
        observations.observe(self.generation_tokens_hist, generated)

    def take_window(self, device: str) -> Window:
        """The work accounted on ``device`` since the last call, and start a new window."""
        with self._lock:
            return self._totals.windows.pop(device, None) or Window()


#: Gauges that describe a model while it exists, by the labels after ``model``: removed with the model.
_BY_DEVICE = "device"
_LIVE_GAUGES: tuple[tuple[cat.MetricSpec, tuple[str | tuple[str, ...], ...]], ...] = (
    # (family, for each label after `model` its values: every device the model ran on, or fixed ones)
    (cat.REQUESTS_RUNNING, ()),
    (cat.OLDEST_RUNNING_AGE, ()),
    (cat.REQUESTS_WAITING, ()),
    (cat.KV_CACHE_BYTES, ()),
    (cat.KV_CACHE_CAPACITY_TOKENS, ()),
    (cat.KV_CACHE_CAPACITY_BYTES, ()),
    (cat.KV_CACHE_BYTES_PER_TOKEN, ()),
    (cat.KV_CACHE_HEADROOM_TOKENS, ()),
    (cat.KV_CACHE_BLOCKS, (KV_BLOCK_STATES,)),
    (cat.LAST_STEP, ()),
    (cat.GPU_BUSY, (_BY_DEVICE, BUSY_SOURCES)),
    (cat.FORWARD_TIME_RATIO, (_BY_DEVICE,)),
    (cat.DECODE_BANDWIDTH, (_BY_DEVICE,)),
    (cat.PREFILL_FLOPS, (_BY_DEVICE,)),
)


def series_for(metrics: Metrics, name: str) -> ModelSeries:
    """The one :class:`ModelSeries` of ``name`` on ``metrics``' registry."""
    series = metrics.model_series.get(name)
    if series is None:
        with metrics.lock:
            series = metrics.model_series.get(name)
            if series is None:
                series = metrics.model_series[name] = ModelSeries(metrics, name)
    return series


def forget_series(metrics: Metrics, name: str, devices: list[tuple[str, ...]]) -> None:
    """Remove the live gauges of model ``name`` (on ``devices``, each given by its catalogue.DEVICE
    labels, for per-device ones) once no instrumented model of that name is left: a model that is gone
    must not keep claiming running requests, cache bytes or a heartbeat. Counters and histograms stay,
    as Prometheus expects. The next model of that name gets fresh series. In multiprocess mode series
    cannot be removed; they are set to 0."""
    with metrics.lock:
        metrics.model_series.pop(name, None)
    for spec, after_model in _LIVE_GAUGES:
        choices = [devices if values == _BY_DEVICE else [(v,) for v in values] for values in after_model]
        for rest in itertools.product(*choices):
            drop_gauge(metrics[spec], name, *itertools.chain.from_iterable(rest))


def drop_gauge(family: Gauge, *labels: str) -> None:
    """Remove one child of a gauge family; set it to 0 in multiprocess mode, where prometheus_client
    cannot remove series."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        family.labels(*labels).set(0)
    else:
        with contextlib.suppress(KeyError):
            family.remove(*labels)
