"""``transformers serve`` with the model in an engine process of its own (transformers 5.25 on).

A request arrives in an API process (the parent, or one of ``--api-server-count`` processes), which
sends it to the engine over a multiprocessing queue with an id it made (``EngineClient._send_request``,
``make_request_id``); the engine hands it to its runner (``GenerateRunner.generate``: a queue and one
generating thread; ``CBGenerateRunner.generate``: the continuous-batching manager) and cancels it when
the API process says so (``runner.cancel``, after the client left).

What the user waits is known in the API process, what the model does in the engine. inferwatch joins the
two by the request's id (docs/serving.md, "transformers serve 5.25: an engine process"):

* in the API process, the middleware opens the request's arrival; when the request is sent, its arrival
  time goes into the program's arrival table at its id (:mod:`.arrivals`), and the arrival is claimed for
  the model's HTTP-edge series (first content, last byte), so the edge does not count it as refused;
* in the engine, the runner's ``generate`` finds the arrival time at the id and opens an arrival there:
  the request waits in ``llm_requests_waiting`` until its ``generate`` (or its batch) claims it, and is
  timed from the arrival (E2E, queue time) with the device timing of the engine's own hooks; its TTFT is
  the API process's, at the first content sent; a cancel ends it as ``cancelled`` at that moment.

Each process's series reach the one endpoint through :mod:`inferwatch.instrumentation.endpoint.program`.
"""

from __future__ import annotations

import functools
import inspect
import time
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any

from inferwatch.instrumentation.launcher.transformers_serve.arrivals import program_table
from inferwatch.instrumentation.launcher.transformers_serve.common import request_logger
from inferwatch.instrumentation.timing.arrival import ARRIVAL, Arrival, in_this_context

NAME = "engine"
#: The arrivals a runner keeps for cancels to find, the most recent (a request that ends in the batch is
#: not told apart from one still running: the oldest are dropped instead).
_ARRIVALS_KEPT = 4096
_RUNNER_METHODS = ("generate", "submit", "cancel")
#: transformers' own parser of a served model's id (``repo@revision:file``), once installed.
_parse_model_id: Callable[[str], tuple] | None = None


def detect(utils: ModuleType, manager: ModuleType) -> bool:
    """Whether the serving modules have this layout's names."""
    client, runner = getattr(manager, "EngineClient", None), getattr(utils, "GenerateRunner", None)
    return (
        client is not None
        and runner is not None
        and inspect.iscoroutinefunction(getattr(client, "_send_request", None))
        and callable(getattr(manager, "make_request_id", None))
        and all(callable(getattr(runner, name, None)) for name in _RUNNER_METHODS)
    )


def install(utils: ModuleType, manager: ModuleType) -> None:
    global _parse_model_id
    _parse_model_id = getattr(utils, "parse_model_id", None)
    manager.make_request_id = _recording_arrivals(manager.make_request_id)
    client = manager.EngineClient
    client._send_request = _claimed_at_the_edge(client._send_request)
    runners = [utils.GenerateRunner]
    batching = getattr(utils, "CBGenerateRunner", None)
    if isinstance(batching, type) and issubclass(batching, utils.GenerateRunner):
        runners.append(batching)
    for runner in runners:
        for name in ("generate", "submit"):
            if name in runner.__dict__:
                setattr(runner, name, _from_the_arrival(runner.__dict__[name]))
        if "cancel" in runner.__dict__:
            runner.cancel = _cancelling(runner.__dict__["cancel"])


# --- in the API process -------------------------------------------------------------------------------


def _recording_arrivals(make_request_id: Callable[[int, int], int]) -> Callable[[int, int], int]:
    """``make_request_id``, which ``_send_request`` calls right before it sends the request: the id's
    arrival goes into the table then."""

    @functools.wraps(make_request_id)
    def wrapper(*args: Any, **kwargs: Any) -> int:
        request_id = make_request_id(*args, **kwargs)
        try:
            arrival, table = ARRIVAL.get(), program_table()
            if arrival is not None and table is not None:
                table.put(request_id, arrival.time)
                # The engine counts what its client never got when it is cancelled: from the last delivery.
                arrival.publish_delivery = functools.partial(table.put_delivery, request_id)
        except Exception:
            request_logger.warning("inferwatch run: a request's arrival was not recorded", exc_info=True)
        return request_id

    return wrapper


def _claimed_at_the_edge(send_request: Callable[..., Any]) -> Callable[..., Any]:
    """A generate request leaving for the engine claims its arrival for its model's HTTP-edge series."""

    @functools.wraps(send_request)
    async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            method = kwargs.get("method", args[0] if args else None)
            arrival = ARRIVAL.get()
            if method == "generate" and arrival is not None and not arrival.claimed:
                arrival.claim(_edge_series(self.model_id))
        except Exception:
            request_logger.warning("inferwatch run: a request's edge is not measured", exc_info=True)
        return await send_request(self, *args, **kwargs)

    return wrapper


def model_label(model_id: str) -> str:
    """A served model's ``model`` label as the engine's instrumentation gives it: the launcher's model
    name, else the label of the path ``from_pretrained`` got (``_name_or_path``: the id less its
    revision)."""
    from inferwatch.instrumentation.instrumenting import name_or_path_label
    from inferwatch.instrumentation.launcher.autoinstrument import launch_settings

    name = launch_settings().model_name
    if name is not None:
        return name
    return name_or_path_label(_parse_model_id(model_id)[0] if _parse_model_id is not None else model_id)


def edge_model_name(build_args: tuple, build_kwargs: dict) -> str | None:
    """The label of requests the app refuses before any model ran: the server's one model, if it has one
    (``build_server``'s model manager's ``force_model``)."""
    manager = build_kwargs.get("model_manager", build_args[0] if build_args else None)
    forced = getattr(manager, "force_model", None)
    return model_label(forced) if isinstance(forced, str) else None


def _edge_series(model_id: str) -> Any:
    from inferwatch.instrumentation.config import InstrumentConfig
    from inferwatch.instrumentation.metrics.catalogue import metrics_for
    from inferwatch.instrumentation.metrics.model_series import series_for

    return series_for(metrics_for(None, InstrumentConfig.from_env()), model_label(model_id))


# --- in the engine ------------------------------------------------------------------------------------


def _arrivals(runner: Any) -> OrderedDict[int, Arrival]:
    arrivals = runner.__dict__.get("_inferwatch_arrivals")
    if arrivals is None:
        arrivals = runner.__dict__["_inferwatch_arrivals"] = OrderedDict()
        queue = getattr(runner, "queue", None)
        if queue is not None:  # the generating thread's jobs: each runs in the context it was queued in
            queue.put = _in_senders_context(queue.put)
    return arrivals


def _open_arrival(runner: Any, request_id: int) -> Arrival:
    """The request's arrival in the engine: at the time the API process recorded, else now; counted as
    waiting for the runner's model until a request of the model claims it."""
    from inferwatch.instrumentation.launcher.autoinstrument import instrument_now

    table = program_table()
    arrived = table.get(request_id) if table is not None else None
    arrival = Arrival(arrived)
    # Every request comes from an API process whose app has the HTTP edge: its TTFT is observed there, at
    # the first content sent, whether or not the table had its arrival (else it would be counted twice).
    arrival.ttft_at_first_content = True
    arrivals = _arrivals(runner)
    arrivals[request_id] = arrival
    while len(arrivals) > _ARRIVALS_KEPT:
        arrivals.popitem(last=False)
    handle = instrument_now(runner.model)
    if handle is not None:
        handle.count_waiting(arrival)
    return arrival


def _from_the_arrival(method: Callable[..., Any]) -> Callable[..., Any]:
    """A runner's ``generate`` or ``submit``: what it starts, here or in the generating thread, has the
    request's arrival."""

    @functools.wraps(method)
    def wrapper(self: Any, request_id: int, *args: Any, **kwargs: Any) -> Any:
        try:
            arrival = _open_arrival(self, request_id)
        except Exception:
            request_logger.warning("inferwatch run: a request is timed from the engine", exc_info=True)
            return method(self, request_id, *args, **kwargs)
        token = ARRIVAL.set(arrival)
        try:
            return method(self, request_id, *args, **kwargs)
        finally:
            ARRIVAL.reset(token)

    return wrapper


def _in_senders_context(put: Callable[..., Any]) -> Callable[..., Any]:
    """The runner's queue's ``put``: a job ``(request_id, function, args, stream)`` queued with an arrival
    open runs in a copy of the queuing context, and closes the arrival when it is done."""

    @functools.wraps(put)
    def wrapper(item: Any, *args: Any, **kwargs: Any) -> Any:
        arrival = ARRIVAL.get()
        if arrival is not None and isinstance(item, tuple) and len(item) == 4 and callable(item[1]):
            item = (item[0], _closing(in_this_context(item[1]), arrival), *item[2:])
        return put(item, *args, **kwargs)

    return wrapper


def _closing(job: Callable[..., Any], arrival: Arrival) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return job(*args, **kwargs)
        finally:
            arrival.close()

    return run


def _cancelling(cancel: Callable[..., Any]) -> Callable[..., Any]:
    """A runner's ``cancel`` (the client left): the request ends as ``cancelled`` now, or stops waiting."""

    @functools.wraps(cancel)
    def wrapper(self: Any, request_id: int, *args: Any, **kwargs: Any) -> Any:
        try:
            arrival = _arrivals(self).pop(request_id, None)
            if arrival is not None:
                table = program_table()
                arrival.delivered_until = table.delivered(request_id) if table is not None else None
                arrival.disconnect(time.perf_counter())
                if not arrival.claimed:
                    arrival.close()
        except Exception:
            request_logger.warning("inferwatch run: a cancelled request was not ended", exc_info=True)
        return cancel(self, request_id, *args, **kwargs)

    return wrapper
