"""In-process instrumentation of PyTorch / transformers inference.

Install with ``pip install 'inferwatch[instrumentation]'``.

::

    from inferwatch.instrumentation import instrument
    handle = instrument(model)          # llm_* metrics on prometheus_client's default registry
    model.generate(...)                 # timed, counted, KV cache measured
    handle.remove()                     # every hook gone

The public names are imported lazily, so ``import inferwatch.instrumentation.<module>`` of a torch-free
module (configuration, exposition) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferwatch.instrumentation.config import InstrumentConfig
    from inferwatch.instrumentation.instrumenting import InstrumentationHandle, instrument
    from inferwatch.instrumentation.tracking import RequestTracker, track_request

_EXPORTS = {
    "InstrumentConfig": "inferwatch.instrumentation.config",
    "InstrumentationHandle": "inferwatch.instrumentation.instrumenting",
    "instrument": "inferwatch.instrumentation.instrumenting",
    "RequestTracker": "inferwatch.instrumentation.tracking",
    "track_request": "inferwatch.instrumentation.tracking",
}

__all__ = ["InstrumentConfig", "InstrumentationHandle", "RequestTracker", "instrument", "track_request"]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
