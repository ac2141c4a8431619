"""The generate wrapper: ``generate`` replaced by an *instance* attribute wrapping the original (the class is
never patched), which opens a request at entry and ends it at exit. Exceptions from the model propagate
unchanged; an OOM is counted first.
"""

from __future__ import annotations

import functools
import time
from typing import Any

from inferwatch.instrumentation.model.compiled import CompiledPath
from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.model.speculative import drafts_for_another, generate_as_draft
from inferwatch.instrumentation.timing.arrival import ARRIVAL
from inferwatch.instrumentation.timing.clock import Fetched
from inferwatch.instrumentation.timing.request import CURRENT_REQUEST, Request, failure_status
from inferwatch.instrumentation.timing.tokens import (
    LiveTokens,
    every_row_generates,
    generated_count,
    new_token_limit,
    prompt_of,
)


class GenerateWrapper:
    """The requests of one model's generate calls."""

    def __init__(self, model: ModelContext, compiled: CompiledPath) -> None:
        self._model = model
        self._compiled = compiled

    def wrap(self, original: Any) -> Any:
        model = self._model

        @functools.wraps(original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            entry = time.perf_counter()
            if not model.active:
                return original(*args, **kwargs)
            current = CURRENT_REQUEST.get()
            if current is not None and current.owner is model:  # generate re-entered from inside itself
                return original(*args, **kwargs)
            if drafts_for_another(model, current):  # a draft model's: part of that request, not traffic
                return generate_as_draft(original, args, kwargs)
            request = self._begin(entry, args, kwargs)
            if request is None:
                return original(*args, **kwargs)
            token = CURRENT_REQUEST.set(request)
            try:
                output = original(*args, **kwargs)
            except BaseException as exc:
                self._exit(token, request)
                self._end(request, None, exc)
                raise
            self._exit(token, request)
            self._succeed(request, kwargs, output)
            return output

        return generate

    def _begin(self, entry: float, args: tuple, kwargs: dict) -> Request | None:
        model = self._model
        try:
            model.follow()
            clock = model.placement.clock
            prompt = prompt_of(args, kwargs)
            prompt_length = 0 if prompt is None else prompt.length
            generation_config = self._generation_config(kwargs)
            live = LiveTokens(
                None if prompt is None else prompt.count(clock),
                1 if prompt is None else prompt.rows,
                every_row_generates(kwargs, generation_config),
            )
            arrival = ARRIVAL.get()
            request = Request(
                model.series,
                clock,
                owner=model,
                background=model.background,
                live=live,
                entry=entry,
                prompt_length=prompt_length,
                token_limit=new_token_limit(kwargs, generation_config, prompt_length),
            )
            if arrival is not None:
                request.arrived(arrival.claim(model.series, request.cancel), arrival.ttft_at_first_content)
            return request
        except Exception as exc:
            model.errors.report("generate_enter", exc)
            return None

    def _exit(self, token: Any, request: Request) -> None:
        """generate returned or raised: this thread's request and the compiled path's hold end."""
        captures = self._model.captures
        if captures.armed:
            captures.generate_ended()
        CURRENT_REQUEST.reset(token)
        self._compiled.generate_ended(request)

    def _succeed(self, request: Request, kwargs: dict, output: Any) -> None:
        try:
            counts = self._token_counts(request, kwargs, output)
        except Exception as exc:
            self._model.errors.report("generate_exit", exc)
            counts = None  # the request is still finished and timed, its tokens go uncounted
        self._end(request, counts)

    def _end(self, request: Request, counts: Fetched | None, failure: BaseException | None = None) -> None:
        """The request ended: served with ``counts`` of generated tokens, or failed with ``failure``."""
        model = self._model
        if request.token_limit is not None and request.token_limit <= 0:
            status = "rejected"  # asked for no token: the client's mistake, however generate took it
        else:
            status = "ok" if failure is None else failure_status(failure)
        try:
            request.finish(status, counts)
        except Exception as exc:
            model.errors.report("generate_exit", exc)

    def _generation_config(self, kwargs: dict) -> Any:
        """The generation config a generate call runs with: its argument's, else the model's."""
        generation_config = kwargs.get("generation_config")
        if generation_config is None:
            generation_config = getattr(self._model.model_ref(), "generation_config", None)
        return generation_config

    def _token_counts(self, request: Request, kwargs: dict, output: Any) -> Fetched | None:
        """The tokens a finished generate generated, computed on the output's device and copied to the
        host asynchronously (see docs/timing.md, "Token counts")."""
        generation_config = self._generation_config(kwargs)
        counts = generated_count(output, request.prompt_length, generation_config, kwargs)
        return None if counts is None else self._model.placement.clock.fetch(counts)
