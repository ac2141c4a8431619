"""The answers of :func:`~.server.start_http_server`'s endpoint: within CPU budgets, from
collections of the registry at most :data:`MAX_AGE` old (docs/serving.md, "The metrics endpoint").

:class:`Renderer` collects the registry and makes answers of it within the renderings' budget, in the
serving process; :class:`EndpointApp` answers requests within the request budget and the quiet-client
rule, from a :class:`Renderer` in the same thread or, in the endpoint's helper process
(:mod:`.helper_process`), from the collections the serving process sends.
"""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import NamedTuple, Protocol, TypeVar

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from inferwatch.common.clock import SYSTEM_CLOCK, LoopClock
from inferwatch.common.httpserver import CpuBudget, Receive, Scope, Send, request_headers, respond
from inferwatch.common.negotiation import NotAcceptable
from inferwatch.instrumentation.endpoint.rendering import (
    Collected,
    Encoded,
    Variant,
    encode,
    method_not_allowed,
    not_acceptable,
    restricted,
    variant_of,
)

#: The share of one core the endpoint's answers may use in a thread of the serving process, averaged,
#: however it is scraped (docs/serving.md, "The metrics endpoint"): collecting, encoding, compressing,
#: writing, from when a request is taken up. Parsing requests, and connections that never make one, are
#: bounded by the HTTP layer's limits instead: charging their CPU to the budget made every scrape wait for
#: it behind a flood of trickling clients (5.9 s). The serving loop's Python thread loses about as much
#: to it through the GIL (docs/benchmarks.md).
CPU_SHARE = 0.025
#: The share of one core the endpoint's helper process may spend, all of its loop's CPU counted (parsing
#: too): its CPU is not the serving loop's (no GIL is shared), so the bound is there for the machine's
#: other work, and is set where 50 scrapers a second are answered without waiting (docs/benchmarks.md).
HELPER_CPU_SHARE = 0.1
#: CPU seconds it may spend at once after a quiet spell (a burst of scrapes is answered without delay).
CPU_BURST = 0.1
#: The oldest, in seconds, the collection of the registry an answer of the endpoint is encoded from may be
#: when the request is taken up, whatever the other clients ask for: an older one is collected again
#: (docs/serving.md, "The metrics endpoint"). Below the shortest scrape interval in common use (1 s) by a
#: quarter of a second of scheduling jitter, so that a client scraping every second or less often never
#: gets the collection it got before.
MAX_AGE = 0.75
#: The part of a core renderings (collecting and encoding) may take while every answer is collected
#: afresh: beyond (several scrapes a second), a request is answered from the last collection while it is
#: younger than :data:`MAX_AGE`. At a normal scrape rate every answer is collected for its request.
RENDER_SHARE = 0.005
#: Rendering CPU seconds that may be spent at once after a quiet spell (about ten renderings).
RENDER_BURST = 0.05
#: About the part of a core renderings may take to keep answers within :data:`MAX_AGE`, the rest of
#: :data:`CPU_SHARE` being left to answering requests: a registry whose collections, with the encodings
#: asked of them, typically take more than ``MAX_AGE * REFRESH_SHARE`` (15 ms) is collected again only
#: once that CPU is paid back at this share, and its answers are older than ``MAX_AGE`` (and say so).
REFRESH_SHARE = 0.02
#: The last collections whose CPU (with their encodings) makes the typical cost, as their median: one
#: slow collection (a garbage collection, the kernel reclaiming memory while it runs) does not hold the
#: next one back. The first collection is not one of them: it does one-off work (the catalogue's collector
#: formats every series' name and labels once: 0.36 s at 64 models, against 5-10 ms for the next ones),
#: and as the only cost known it held the next collections back 18 s (docs/benchmarks.md, "Issue 41: the
#: endpoint at 64 models"). Its CPU still counts against the renderings' budget.
_COSTS_KEPT = 3
#: The endpoint's response header with the age, in seconds, of the collection the answer was encoded
#: from, as it is sent (``0.412``); answers from a collection made for an earlier request also carry
#: ``Age`` (RFC 9111, whole seconds), as a cache would.
AGE_HEADER = "Inferwatch-Collection-Age"
#: A connection that waited this long (seconds) since its last answer, or a new one, is a quiet client:
#: its request is taken up at once, ahead of clients that scrape back to back, as long as the CPU budget
#: is less than :data:`CPU_BURST` in debt (docs/serving.md, "The metrics endpoint").
QUIET = 0.5
# Connections whose last answer is remembered for QUIET: the most recent ones.
_CLIENTS_KEPT = 4096
# Answers kept per collection, one per variant of what requests ask for (format, compression, names): a
# client asking for a new variant with every request must not grow memory.
_RENDERS_KEPT = 8


class Collection:
    """One collection of the registry, and the answers encoded from it so far, by variant."""

    def __init__(self, families: list[Metric], taken: float) -> None:
        self.families = families
        self.taken = taken  # the monotonic clock (one for every process) when the collection began
        self.answers: dict[Variant, Encoded] = {}
        self.cost = 0.0  # CPU seconds of the collection and of what was made of it in this process
        self.shipped: bytes | None = None  # the collection as sent to the helper process, once sent

    def answer(self, variant: Variant) -> Encoded:
        answer = self.answers.get(variant)
        if answer is None:
            families = self.families
            if variant.names is not None:
                families = restricted(families, variant.names)
            answer = self.answers[variant] = encode(Collected(families), variant)
            if len(self.answers) > _RENDERS_KEPT:
                del self.answers[next(iter(self.answers))]  # the first encoded
        return answer


class Rendering(NamedTuple):
    """An answer's body and headers, and what the endpoint says about the collection it came from."""

    exposition: Encoded
    taken: float  # when its collection began (:attr:`Collection.taken`)
    collected: bool  # whether it was collected for the request it answers
    cpu: float  # CPU seconds the answering thread spent making it (collecting, encoding)


class Renderings(Protocol):
    """Where :class:`EndpointApp` gets its answers: the registry in this process (:class:`Renderer`), or
    the serving process's collections, in the endpoint's helper process (:mod:`.helper_process`)."""

    async def rendering(self, variant: Variant) -> Rendering: ...


T = TypeVar("T")


class Renderer:
    """Collections of the registry, and what is made of them, within the renderings' CPU budgets.

    A request gets an answer encoded from one collection of the registry that every variant (format,
    compression, names) shares, each variant encoded from it once: a new collection while renderings have
    used less than :data:`RENDER_SHARE` (every answer is then collected for its request), or when the last
    one is :data:`MAX_AGE` old; else the last one. Under several scrapes a second the answers are up to
    ``MAX_AGE`` old instead of the serving process slow, whatever variants the clients ask for, and
    renderings take one collection per ``MAX_AGE`` plus one encoding per variant asked for (in the helper
    process: one collection and its serialization). Where that would be more than :data:`REFRESH_SHARE`
    of a core (a typical collection over 15 ms), a collection is kept until its cost is paid back at that
    share instead.
    """

    def __init__(
        self,
        registry: Collector,
        clock: LoopClock = SYSTEM_CLOCK,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self._registry = registry
        self._now = clock.monotonic
        self._cpu = cpu  # the CPU of the thread that renders: the serving process's
        self._rendered = 0.0  # CPU seconds every collection and encoding took, together
        self._rendering = CpuBudget(RENDER_SHARE, RENDER_BURST, clock=lambda: self._rendered, wall=clock)
        self._snapshot: Collection | None = None
        self._costs: deque[float] = deque(maxlen=_COSTS_KEPT)  # of the collections before the last
        self.collections = 0  # made so far

    def _max_age(self) -> float:
        """How old the last collection may get before a request collects again: MAX_AGE, or the time the
        typical collection's cost takes to pay back at REFRESH_SHARE, whichever is longer."""
        typical = statistics.median(self._costs) if self._costs else 0.0
        return max(MAX_AGE, typical / REFRESH_SHARE)

    async def rendering(self, variant: Variant) -> Rendering:
        answer, snapshot, collected, cpu = self.use(lambda snapshot: snapshot.answer(variant))
        return Rendering(answer, snapshot.taken, collected, cpu)

    def use(self, make: Callable[[Collection], T]) -> tuple[T, Collection, bool, float]:
        """``make`` of the last collection or of a new one, its CPU counted with the collection's; the
        collection, whether it was collected for this call, and the CPU seconds the call took."""
        started = self._cpu()
        try:
            snapshot, now = self._snapshot, self._now()
            collected = (
                snapshot is None or self._rendering.available() or now - snapshot.taken >= self._max_age()
            )
            if snapshot is None or collected:
                families = list(self._registry.collect())
                if snapshot is not None and self.collections > 1:  # not the first's (_COSTS_KEPT)
                    self._costs.append(snapshot.cost)
                self.collections += 1
                snapshot = self._snapshot = Collection(families, now)
            made = make(snapshot)
        finally:
            spent = self._cpu() - started
            self._rendered += spent
        snapshot.cost += spent
        return made, snapshot, collected, spent

    def charge(self, cpu: float) -> None:
        """Count ``cpu`` seconds of renderings made elsewhere (the helper process's encodings) against the
        renderings' budget, so that collections for every request stop at the same share either way."""
        self._rendered += cpu

    def reusable_until(self, snapshot: Collection) -> float:
        """Until when the last collection would be used again (its ``taken`` if it would not be now)."""
        if self._rendering.available():
            return snapshot.taken
        return snapshot.taken + self._max_age()


class EndpointApp:
    """:func:`start_http_server`'s app: the answers of :func:`make_asgi_app` within a CPU budget, from
    collections at most :data:`MAX_AGE` old (:class:`Renderer`).

    A request waits while answers have used more than ``share`` of a core (:data:`CPU_SHARE` in the
    serving process; :data:`HELPER_CPU_SHARE` in the endpoint's helper process, counting everything its
    thread does, with ``whole_thread``), unless its connection is
    new or was :data:`QUIET` since its last answer: such a request (a scrape at a normal pace) is taken up
    at once, ahead of connections that scrape back to back, while the budget is less than
    :data:`CPU_BURST` in debt. Each answer says how old its collection is (:data:`AGE_HEADER`).
    """

    def __init__(
        self,
        renderings: Renderings,
        clock: LoopClock = SYSTEM_CLOCK,
        cpu: Callable[[], float] = time.thread_time,
        share: float = CPU_SHARE,
        whole_thread: bool = False,
    ) -> None:
        self._renderings = renderings
        self._now = clock.monotonic
        self._cpu = cpu  # where the CPU of answers is read: the thread that answers
        self._answering = 0.0  # CPU seconds answering requests took, from being taken up to being sent
        # In the serving process only answers count (charging the parsing of a flood of trickling clients
        # made every scrape wait for it); the helper process is there only to serve, so all of its loop's
        # CPU counts, flat-out scrapers' parsing included.
        counted = cpu if whole_thread else lambda: self._answering
        self._requests = CpuBudget(share, CPU_BURST, clock=counted, wall=clock)
        # Connection (client address and port) -> when its last answer was sent, most recent last.
        self._answered: OrderedDict[object, float] = OrderedDict()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if method not in ("GET", "HEAD"):
            answer = method_not_allowed()
            await respond(send, 405, answer.headers, answer.body, head=method == "HEAD")
            return
        client = scope.get("client")
        last = self._answered.get(client)
        await self._requests.acquire(urgent=last is None or self._now() - last >= QUIET)
        # The CPU of this answer, not of what the loop did while it waited for a rendering from the
        # serving process (other connections' requests): the rendering says what it cost this thread.
        spent = 0.0
        try:
            started = self._cpu()
            headers = request_headers(scope)
            try:
                variant = variant_of(
                    headers.get("accept"),
                    headers.get("accept-encoding"),
                    scope.get("query_string", b"").decode("latin-1"),
                )
            except NotAcceptable as refused:  # answered here: no collection is asked for
                refusal = not_acceptable(refused)
                await respond(send, 406, refusal.headers, refusal.body, head=method == "HEAD")
                spent += self._cpu() - started
                return
            spent += self._cpu() - started
            answer, taken, collected, cpu = await self._renderings.rendering(variant)
            spent += cpu
            started = self._cpu()
            age = max(0.0, self._now() - taken)
            fields = [*answer.headers, (AGE_HEADER, f"{age:.3f}")]
            if not collected:
                fields.append(("Age", str(int(age))))
            await respond(send, 200, fields, answer.body, head=method == "HEAD")
            spent += self._cpu() - started
        finally:
            self._answering += spent
            self._answered[client] = self._now()
            self._answered.move_to_end(client)
            if len(self._answered) > _CLIENTS_KEPT:
                self._answered.popitem(last=False)
