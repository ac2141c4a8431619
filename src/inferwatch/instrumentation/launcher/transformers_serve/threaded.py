"""``transformers serve`` with the model in the serving process (transformers 5.17 to 5.24).

A handler hands a request to the model's ``GenerateManager``, which queues a job for the model's one
``InferenceThread``. The request is counted in ``llm_requests_waiting`` from the hand-over, and the job
carries the handler's context (its arrival) to the inference thread, so ``generate`` is timed from the
request's arrival.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

from inferwatch.instrumentation.launcher.transformers_serve.common import logger
from inferwatch.instrumentation.timing.arrival import ARRIVAL, in_this_context

NAME = "threaded"


def detect(utils: ModuleType, manager: ModuleType) -> bool:
    """Whether the serving modules have this layout's names."""
    thread = getattr(utils, "InferenceThread", None)
    generate_manager = getattr(utils, "GenerateManager", None)
    return (
        thread is not None
        and generate_manager is not None
        and all(callable(getattr(thread, name, None)) for name in ("submit", "async_submit"))
        and all(
            callable(getattr(generate_manager, name, None))
            for name in ("generate_streaming", "generate_non_streaming")
        )
    )


def install(utils: ModuleType, manager: ModuleType) -> None:
    thread_class, generate_manager = utils.InferenceThread, utils.GenerateManager
    for name in ("submit", "async_submit"):
        setattr(thread_class, name, _in_callers_context(getattr(thread_class, name)))
    generate_manager.generate_streaming = _counting_waiting(generate_manager.generate_streaming)
    generate_manager.generate_non_streaming = _counting_waiting_async(generate_manager.generate_non_streaming)


def _in_callers_context(submit: Callable[..., Any]) -> Callable[..., Any]:
    """The job runs on the inference thread in a copy of the submitting handler's context (its arrival)."""

    @functools.wraps(submit)
    def wrapper(self: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return submit(self, in_this_context(fn), *args, **kwargs)

    return wrapper


def _count_waiting(model: Any) -> None:
    """Count the open arrival as waiting for ``model`` (instrumented now); never raises."""
    from inferwatch.instrumentation.launcher.autoinstrument import instrument_now

    try:
        arrival = ARRIVAL.get()
        if arrival is None:
            return
        handle = instrument_now(model)
        if handle is not None:
            handle.count_waiting(arrival)
    except Exception:
        logger.warning("inferwatch run: cannot count a waiting request", exc_info=True)


def _counting_waiting(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        _count_waiting(model)
        return method(self, model, *args, **kwargs)

    return wrapper


def _counting_waiting_async(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    async def wrapper(self: Any, model: Any, *args: Any, **kwargs: Any) -> Any:
        _count_waiting(model)
        return await method(self, model, *args, **kwargs)

    return wrapper
