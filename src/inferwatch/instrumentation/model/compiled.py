"""generate's compiled decode step: ``get_compiled_call`` wrapped, so the ``torch.compile``'d call generate
uses for decode steps with a static cache is timed from around it, never from inside it (no graph break, no
recompilation when hooks come or go), while the forward hooks, traced into that compiled region, fold to
nothing. Once a request's shapes are settled its steps are a
:class:`~inferwatch.instrumentation.timing.request.DecodeRun`: two marks per step and nothing else in the hot
path (docs/timing.md, "The compiled decode step").
"""

from __future__ import annotations

import functools
import weakref
from typing import Any

from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.model.forward import ForwardHooks, input_tensor
from inferwatch.instrumentation.timing.request import (
    CURRENT_REQUEST,
    RUN_DRAIN_MARKS,
    DecodeRun,
    Request,
)


class CompiledPath:
    """The compiled decode step of one model's generate calls."""

    def __init__(self, model: ModelContext, hooks: ForwardHooks) -> None:
        self._model = model
        self._hooks = hooks
        #: Requests whose generate took the forward hooks out (ForwardHooks.hide) until it ends.
        self._hid_hooks: weakref.WeakSet[Request] = weakref.WeakSet()

    def wrap(self, original: Any) -> Any:
        """``get_compiled_call``, through which generate gets the compiled forward of its decode steps:
        it comes back wrapped (:meth:`timed_around`)."""

        @functools.wraps(original)
        def get_compiled_call(*args: Any, **kwargs: Any) -> Any:
            compiled = original(*args, **kwargs)
            return self.timed_around(compiled) if self._model.active else compiled

        return get_compiled_call

    def generate_ended(self, request: Request) -> None:
        """``request``'s generate returned or raised: the forward hooks it took out go back."""
        if request in self._hid_hooks:
            self._hid_hooks.discard(request)
            self._hooks.show(self._model.model_ref())

    def timed_around(self, compiled: Any) -> Any:
        # A closure per generate: kept by nobody once generate returns (it holds the module, as
        # ``compiled`` does).
        model, hooks = self._model, self._hooks
        module = model.model_ref()

        def compiled_forward(*args: Any, **kwargs: Any) -> Any:
            request = CURRENT_REQUEST.get()
            run = None if request is None else request.path.run
            if run is None or not model.active:
                hid = self._hid_hooks
                if (
                    request is not None
                    and request.owner is model
                    and request not in hid
                    and hooks.hide(module)
                ):
                    hid.add(request)
                run = self._start_run(request, args, kwargs)
            if run is None:
                hooks.before(None, args, kwargs)
                output = model.call_timed_around(compiled, args, kwargs)
                hooks.after(None, args, kwargs, output)
                return output
            # The hot path of a settled decode step: a mark before, a mark after, nothing else. The forward
            # hooks stand aside for a request with a run (should they be in, see ForwardHooks.hide).
            captures = model.captures
            if captures.armed:
                captures.boundary(False)
            mark = run.mark
            try:
                start = mark()
            except Exception as exc:
                model.errors.report("forward_pre", exc)
                return compiled(*args, **kwargs)
            output = compiled(*args, **kwargs)
            try:
                end = mark()
                marks = run.marks
                marks.append(start)
                marks.append(end)
                if len(marks) >= RUN_DRAIN_MARKS:
                    request.drain()  # earlier steps, complete since generate's last synchronization
            except Exception as exc:
                model.errors.report("forward_post", exc)
            return output

        return compiled_forward

    def _start_run(self, request: Request | None, args: tuple, kwargs: dict) -> DecodeRun | None:
        """The request's :class:`DecodeRun`, begun now if its decode steps are settled: its third forward
        or later, one new token per sequence, a preallocated cache already measured. None: the forward
        hooks time this step."""
        model = self._model
        if (
            request is None
            or request.owner is not model
            or request.forwards < 2
            or not request.kv_static
            or request.path.rounds is not None  # an assisted round's tokens are its criteria mark's
            or not model.active
        ):
            return None
        try:
            placement = model.placement
            tensor = input_tensor(args, kwargs)
            if request.clock is not placement.clock or tensor is None or tensor.shape[1] != 1:
                return None
            read_bytes = placement.footprint.decode_bytes(request.kv_bytes)
            run = DecodeRun(request.clock, placement.label, tensor.shape[0], read_bytes)
            request.begin_run(run)
            return run
        except Exception as exc:
            model.errors.report("forward_pre", exc)
            return None
