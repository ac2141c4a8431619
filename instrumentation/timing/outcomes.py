"""How a request that raised ended: ``cancelled`` (its client went away), ``oom``, or ``error``."""

from __future__ import annotations

import asyncio

import torch

_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")
#: What serving stacks raise inside generate when the client went away: transformers serve's streamer
#: (``_GenerationCancelled``, by name: it is private) and the generic ways a task or generator is stopped.
_CANCELLATION_TYPES = (GeneratorExit, asyncio.CancelledError)
_CANCELLATION_NAMES = frozenset({"_GenerationCancelled", "GenerationCancelled"})


def is_oom(exc: BaseException) -> bool:
    """A CUDA OOM, or an allocator failure of another backend recognised by its message."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, (RuntimeError, MemoryError)) and any(m in str(exc).lower() for m in _OOM_MESSAGES)


def is_cancellation(exc: BaseException) -> bool:
    """The request was abandoned by its client, not failed by the model."""
    return isinstance(exc, _CANCELLATION_TYPES) or type(exc).__name__ in _CANCELLATION_NAMES


def failure_status(exc: BaseException) -> str:
    """The ``status`` label of a request that ended with ``exc``."""
    if is_cancellation(exc):
        return "cancelled"
    return "oom" if is_oom(exc) else "error"
