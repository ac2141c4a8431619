"""generate's stopping criteria as the place a token counts as produced.

``_get_stopping_criteria`` is wrapped on the model (an instance attribute); the criteria generate calls
each time it has sampled the next tokens come back as :class:`TokenMarkingCriteria`, which records a clock
mark there first: a token counts as produced when the device has sampled it (after logits processing and
sampling), not at the end of the forward.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from inferwatch.instrumentation.model.context import ModelContext
from inferwatch.instrumentation.timing.arrival import ARRIVAL, Arrival
from inferwatch.instrumentation.timing.request import CURRENT_REQUEST, Request


def generates_like_transformers(module: torch.nn.Module) -> bool:
    """Whether ``module.generate`` is transformers' (whose loop calls ``_get_stopping_criteria``'s list)."""
    try:
        from transformers.generation.utils import GenerationMixin
    except ImportError:
        return False
    return isinstance(module, GenerationMixin) and callable(getattr(module, "_get_stopping_criteria", None))


@functools.cache
def token_marking_criteria() -> type | None:
    """:class:`TokenMarkingCriteria`, made on first use (transformers is imported only where it is used);
    None without transformers."""
    try:
        from transformers.generation.stopping_criteria import StoppingCriteriaList
    except ImportError:
        return None

    class TokenMarkingCriteria(StoppingCriteriaList):
        """generate's own stopping criteria, which it calls each time it has sampled the next tokens: a
        clock mark is recorded there first.

        No criterion is added to the list: transformers ORs every criterion's answer into the result, a
        device op per step (9.5 µs of host time on the H200 machine, host_costs.py). The list holds the
        request, never the model; a deep copy of it is transformers' plain list."""

        def __init__(self, criteria: list, model: ModelContext, request: Request) -> None:
            super().__init__(criteria)
            self._model = model
            self._request = request

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            request = self._request
            path = request.path
            if path.run is None:
                try:
                    rounds = path.rounds  # an assisted round brings its kept tokens + 1
                    tokens = 1 if rounds is None else rounds.round_tokens(input_ids.shape[-1])
                    if tokens:
                        request.mark_tokens(self._model.placement.label, tokens)
                except Exception as exc:
                    self._model.errors.report("token_mark", exc)
            else:
                # A compiled run places its tokens at its steps' end marks: from now on this is
                # transformers' own list again, with no frame of inferwatch's left in the step.
                try:
                    self.__class__ = StoppingCriteriaList
                except TypeError as exc:
                    self._model.errors.report("token_mark", exc)
            return StoppingCriteriaList.__call__(self, input_ids, scores, **kwargs)

        def __deepcopy__(self, memo: dict) -> StoppingCriteriaList:
            return StoppingCriteriaList(copy.deepcopy(list(self), memo))

    return TokenMarkingCriteria


@functools.cache
def _disconnect_criterion() -> type:
    from transformers.generation.stopping_criteria import StoppingCriteria

    class StopOnDisconnect(StoppingCriteria):
        """Ends every row once the client of ``arrival`` has gone (see :func:`stop_on_disconnect`)."""

        def __init__(self, arrival: Arrival | None) -> None:
            self._arrival = arrival

        def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
            gone = self._arrival is not None and self._arrival.disconnected_at is not None
            return torch.full((input_ids.shape[0],), gone, dtype=torch.bool, device=input_ids.device)

    return StopOnDisconnect


def stop_on_disconnect() -> Any:
    """A transformers ``StoppingCriteria`` that ends ``generate`` once the client of the request being
    handled here (the arrival the middleware opened) has gone; it never stops a call outside one::

        criteria = StoppingCriteriaList([stop_on_disconnect()])   # in the handler, before the thread
        Thread(target=model.generate, kwargs={..., "stopping_criteria": criteria}).start()

    It costs one small device op per step; the middleware's ``stop_generation_on_disconnect=True`` adds
    it to every generate call of its requests instead."""
    return _disconnect_criterion()(ARRIVAL.get())


def wrap_stopping_criteria(model: ModelContext, original: Any) -> Any:
    """``_get_stopping_criteria``, through which generate builds the stopping criteria of its loop: for a
    request of ``model`` they come back as :class:`TokenMarkingCriteria`."""

    @functools.wraps(original)
    def get_stopping_criteria(*args: Any, **kwargs: Any) -> Any:
        criteria = original(*args, **kwargs)
        request = CURRENT_REQUEST.get()
        if not model.active or request is None or request.owner is not model or request.path.marks_sampling:
            return criteria
        try:
            marking = token_marking_criteria()
            if not isinstance(criteria, marking.__bases__[0]):  # not transformers' list: left alone
                return criteria
            criteria = marking(criteria, model, request)
            request.mark_tokens_at_sampling()
            arrival = ARRIVAL.get()
            if arrival is not None and arrival.stop_on_disconnect:
                criteria.append(_disconnect_criterion()(arrival))
        except Exception as exc:
            model.errors.report("generate_enter", exc)
        return criteria

    return get_stopping_criteria
