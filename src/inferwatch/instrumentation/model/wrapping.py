"""Wrapping a method on one object, never on its class: how inferwatch hooks ``generate`` and its kin on the
model, and the continuous-batching manager's points on the objects transformers hands out."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

#: Every wrapper made here (weakly: a wrapper lives as long as the object it is set on).
_WRAPPERS: weakref.WeakSet[Any] = weakref.WeakSet()


def wrap_method(owner: Any, name: str, make: Callable[[Any], Any]) -> Any | None:
    """Set ``make(owner.name)`` on ``owner`` as an instance attribute, where ``owner.name`` is not already a
    wrapper of ours (an object reached twice, e.g. a persistent manager, keeps its one wrapper); the
    wrapper, or None where there was one. The attribute it replaced is remembered for :func:`unwrap_method`.

    Membership of a weak set, not a flag on the function, tells a wrapper of ours: a caller's own wrapper
    made with ``functools.wraps`` copies a wrapped function's attributes."""
    replaced = owner.__dict__.get(name)
    if replaced is not None and replaced in _WRAPPERS:
        return None
    original = getattr(owner, name)
    wrapper = functools.wraps(original)(make(original))
    wrapper._inferwatch_replaced = replaced
    _WRAPPERS.add(wrapper)
    setattr(owner, name, wrapper)
    return wrapper


def unwrap_method(owner: Any, name: str, wrapper: Any) -> None:
    """Put back what ``wrapper`` replaced on ``owner``, if ``wrapper`` is still what ``owner.name`` is; a
    wrapper someone set on top of it keeps ours in its chain (as a pass-through once it is inactive)."""
    if owner.__dict__.get(name) is not wrapper:
        return
    if wrapper._inferwatch_replaced is not None:
        setattr(owner, name, wrapper._inferwatch_replaced)
    else:
        delattr(owner, name)
