"""The launcher's part inside the launched program: serve the metrics, instrument models as they appear.

:func:`bootstrap` runs from the launcher's ``sitecustomize`` when the interpreter starts, before the
program's own code. transformers may be imported later, or never, so nothing is imported eagerly: a
post-import hook waits for ``transformers.modeling_utils`` (the module every model class comes from) and
then wraps two methods of ``PreTrainedModel``, whose roles are the same in transformers 5.17 and 5.24:

* ``post_init``, which every model's ``__init__`` calls last: it sees direct construction
  (``LlamaForCausalLM(config)``) and ``from_config``;
* ``from_pretrained``, which builds the model (``post_init`` included) on the meta device, loads the
  weights and may install a custom ``generate`` from the checkpoint: models are taken when it returns.

``transformers serve`` (the ``serving`` extra) is hooked too, when its modules load, by the integration
that fits the installed transformers (:mod:`.transformers_serve`).

The first process of the program serves the endpoint; the processes it starts (a serving engine, API
servers, workers) report their series there once they build a generating model or serve the HTTP edge
(:mod:`inferwatch.instrumentation.endpoint.program`), so the program has one endpoint whatever its processes.

A model is not instrumented there but at its first ``generate`` or ``init_continuous_batching`` call
(continuous batching: ``generate_batch``, ``transformers serve --continuous-batching``), through stand-ins
on the instance (:class:`InstrumentOnFirstCall`): by then the model is on the device and in the
dtype it serves with, a checkpoint's custom ``generate`` is in place, and a model that is only built to
be saved, converted or trained is never instrumented at all. If the program instruments a model
itself before its first ``generate``, the stand-in only passes calls through. Only generating models
(``GenerationMixin``, not encoder-decoder) are taken; their inner base models also pass through
``post_init`` and are skipped. Every failure here is contained and logged on the ``inferwatch.run``
logger: the program keeps running, uninstrumented.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import TYPE_CHECKING, Any

from inferwatch.instrumentation.endpoint.program import (
    HUB_ENV,
    ProgramCollector,
    ProgramHub,
    join_program,
    max_collection_from_env,
)
from inferwatch.instrumentation.endpoint.server import (
    mark_process_dead,
    multiprocess_registry,
    start_http_server,
)
from inferwatch.instrumentation.launcher import transformers_serve
from inferwatch.instrumentation.launcher.command import SERVER_PID_ENV, LaunchSettings
from inferwatch.instrumentation.launcher.transformers_serve.arrivals import ARRIVALS_ENV, create_table_file

if TYPE_CHECKING:
    from inferwatch.instrumentation.instrumenting import InstrumentationHandle

logger = logging.getLogger("inferwatch.run")

HOOKED_MODULE = "transformers.modeling_utils"

_settings = LaunchSettings()
_loading = threading.local()  # .depth: nesting of from_pretrained calls in this thread
_exit_hook_lock = threading.Lock()
_exit_hook_registered = False


def bootstrap() -> None:
    """Start the endpoint (in the first process of the program only) and hook transformers."""
    global _settings
    try:
        _settings = LaunchSettings.from_env()
    except ValueError as exc:
        logger.warning("inferwatch run: %s; the program runs uninstrumented", exc)
        return
    if _settings.serve:
        _start_server()
    for name, patch in (
        (HOOKED_MODULE, _patch_transformers),
        (transformers_serve.SERVER_MODULE, transformers_serve.on_server_module),
        (transformers_serve.MANAGER_MODULE, transformers_serve.on_manager_module),
    ):
        if name in sys.modules:
            patch(sys.modules[name])
        else:
            sys.meta_path.insert(0, PostImportHook(name, patch))


def launch_settings() -> LaunchSettings:
    """The launcher's settings in this process."""
    return _settings


def _start_server() -> None:
    owner = os.environ.get(SERVER_PID_ENV)
    if owner and owner != str(os.getpid()):
        return
    # Claimed before trying: when this process cannot listen, its children must not try either. (Forked
    # children do not inherit the server's thread, and see the claim too.)
    os.environ[SERVER_PID_ENV] = str(os.getpid())
    _share_arrival_table()
    try:
        if _settings.multiprocess_dir:  # the processes' files are the merge; a killed worker's gauges go
            registry = multiprocess_registry(_settings.multiprocess_dir, forget_dead=True)
        else:
            registry = _program_registry()
        server = start_http_server(_settings.port, _settings.address, registry)
    except Exception as exc:
        logger.warning("inferwatch run: metrics endpoint not started: %s", exc)
        return
    sys.stderr.write(f"inferwatch run: serving metrics on {server.url}\n")


def _share_arrival_table() -> None:
    """The table the program's processes hand their requests' arrivals over in, announced to them. An
    anonymous file's descriptor is held open for the program's life (the others open it through this
    process's ``/proc``); a temporary file, where there is none, is removed at exit."""
    try:
        table = create_table_file()
    except OSError as exc:
        logger.warning("inferwatch run: requests are timed from the engine, not their arrival: %s", exc)
        return
    if table.temporary:
        atexit.register(_remove, table.path)
    os.environ[ARRIVALS_ENV] = table.path


def _program_registry() -> ProgramCollector | None:
    """What the endpoint collects: this process's registry and the hub's, which the program's other
    processes report to (announced to them in the environment)."""
    try:
        hub = ProgramHub(max_collection_from_env(os.environ))
    except (OSError, ValueError) as exc:  # the launcher checked the bound: only a program's own change
        logger.warning("inferwatch run: only this process's metrics are served: %s", exc)
        return None
    os.environ[HUB_ENV] = hub.address
    return ProgramCollector(hub)


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


class PostImportHook(importlib.abc.MetaPathFinder):
    """Calls ``callback(module)`` once, right after the module ``name`` has executed, whenever and however
    it gets imported. It finds nothing itself: it lets the other finders find the module and wraps the
    ``exec_module`` of the (per-import) loader they return."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callback = callback

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != self.name:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_module_then_callback(module: ModuleType) -> None:
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            self.callback(module)

        loader.exec_module = exec_module_then_callback  # type: ignore[method-assign]
        return spec


def _patch_transformers(modeling_utils: ModuleType) -> None:
    try:
        model_class = modeling_utils.PreTrainedModel
        if getattr(model_class.post_init, "_inferwatch_wrapped", False):
            return
        model_class.post_init = _wrap_post_init(model_class.post_init)
        model_class.from_pretrained = classmethod(_wrap_from_pretrained(model_class.from_pretrained.__func__))
    except Exception:
        logger.warning(
            "inferwatch run: could not hook transformers; models stay uninstrumented", exc_info=True
        )


def _wrap_post_init(post_init: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(post_init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = post_init(self, *args, **kwargs)
        if not getattr(_loading, "depth", 0):
            watch_model(self)
        return result

    wrapper._inferwatch_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _wrap_from_pretrained(from_pretrained: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(from_pretrained)
    def wrapper(cls: type, *args: Any, **kwargs: Any) -> Any:
        _loading.depth = getattr(_loading, "depth", 0) + 1
        try:
            loaded = from_pretrained(cls, *args, **kwargs)
        finally:
            _loading.depth -= 1
        if not _loading.depth:
            # output_loading_info=True returns (model, info).
            watch_model(loaded[0] if isinstance(loaded, tuple) else loaded)
        return loaded

    return wrapper


def _is_generating_model(model: Any) -> bool:
    from transformers.generation.utils import GenerationMixin

    config = getattr(model, "config", None)
    return isinstance(model, GenerationMixin) and not getattr(config, "is_encoder_decoder", False)


#: The calls that start a watched model's first request: ``generate``, and continuous batching's manager.
FIRST_USE_METHODS = ("generate", "init_continuous_batching")


def watch_model(model: Any) -> None:
    """Have a causal LM instrumented at its first ``generate`` or ``init_continuous_batching`` call; never
    raises."""
    try:
        if not _is_generating_model(model):
            return
        for name in FIRST_USE_METHODS:
            if hasattr(model, name) and not isinstance(model.__dict__.get(name), InstrumentOnFirstCall):
                setattr(model, name, InstrumentOnFirstCall(model, name))
        # From the model's load on, not its first request: the endpoint shows the engine (and its death)
        # before any request came.
        join_program("engine")
    except Exception:
        logger.warning("inferwatch run: cannot watch %s", type(model).__name__, exc_info=True)


class InstrumentOnFirstCall:
    """One of a model's :data:`FIRST_USE_METHODS` until the first call of any of them, which instruments
    the model and then runs the real method (an instance attribute the checkpoint installed, or the
    class's method)."""

    def __init__(self, model: Any, name: str) -> None:
        self._model = weakref.ref(model)
        self._name = name
        self._previous = model.__dict__.get(name)
        self._retired = False

    def _put_back(self, model: Any) -> None:
        if not self._retired and model.__dict__.get(self._name) is self:
            if self._previous is None:
                delattr(model, self._name)
            else:
                setattr(model, self._name, self._previous)
            self._retired = True

    def retire(self, model: Any) -> InstrumentationHandle | None:
        """Put every real method back and instrument the model (once)."""
        with _first_call_lock:
            if self._retired:
                return None
            for name in FIRST_USE_METHODS:
                stand_in = model.__dict__.get(name)
                if isinstance(stand_in, InstrumentOnFirstCall):
                    stand_in._put_back(model)
            return instrument_model(model)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        model = self._model()
        self.retire(model)
        if self._retired:
            # The first call, or one that fetched this stand-in before the first call replaced it.
            return getattr(model, self._name)(*args, **kwargs)
        # Something wrapped the method on top of this stand-in (the program called instrument() itself, or
        # another library): pass the call through to the real method.
        original = self._previous or getattr(type(model), self._name).__get__(model)
        return original(*args, **kwargs)


_first_call_lock = threading.RLock()


def instrument_now(model: Any) -> InstrumentationHandle | None:
    """Instrument a watched model before its first generate (a server about to queue a request for it);
    the model's handle, None if it cannot be instrumented."""
    for name in FIRST_USE_METHODS:
        stand_in = model.__dict__.get(name)
        if isinstance(stand_in, InstrumentOnFirstCall):
            stand_in.retire(model)
    return instrument_model(model)


def instrument_model(model: Any) -> InstrumentationHandle | None:
    """Instrument ``model`` with the launcher's settings (instrument() keeps the handle, and returns the
    live one of a model already instrumented); never raises."""
    global _exit_hook_registered
    try:
        from inferwatch.instrumentation import InstrumentConfig, instrument

        handle = instrument(model, model_name=_settings.model_name, config=InstrumentConfig.from_env())
        with _exit_hook_lock:
            if _settings.multiprocess_dir and not _exit_hook_registered:
                atexit.register(_forget_live_gauges)
                _exit_hook_registered = True
        return handle
    except Exception:
        logger.warning(
            "inferwatch run: could not instrument %s; it runs uninstrumented",
            type(model).__name__,
            exc_info=True,
        )
        return None


def _forget_live_gauges() -> None:
    # os.getpid() at exit, not at registration: forked workers inherit this handler.
    try:
        mark_process_dead(os.getpid(), _settings.multiprocess_dir)
    except Exception:
        logger.warning("inferwatch run: could not clean up multiprocess files", exc_info=True)
