"""The model's forward hooks: a pre-hook and a post-hook (``register_forward_pre_hook`` /
``register_forward_hook``) that record a clock mark each, read input and KV-cache *shapes*, and attribute
the pass to the request running in this thread (a context variable set by the generate wrapper or by
``track_request``); a pass outside any request is timed on its own.

Both hooks stand aside while a forward is timed from around it (``ModelContext.timed_around``: a
continuous-batching step, generate's compiled call) or traced by ``torch.compile``, so one pass is never
timed twice.
"""

from __future__ import annotations

import threading
import time
from typing import Any, NamedTuple

import torch

from inferwatch.instrumentation.metrics.model_series import KVCacheSize
from inferwatch.instrumentation.model.context import ModelContext, Placement
from inferwatch.instrumentation.model.kvcache import measure, output_cache
from inferwatch.instrumentation.timing.request import CURRENT_REQUEST, LooseForward, Step

#: A request's KV cache is measured after its prefill, its first decode step and then every this many
#: steps: the gauge trails the cache by fewer tokens than that.
KV_MEASURE_INTERVAL = 16


def input_tensor(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A forward's ``input_ids`` (or ``inputs_embeds``): [batch, new tokens, ...]."""
    tokens = kwargs.get("input_ids")
    if tokens is None and args:
        tokens = args[0]
    if isinstance(tokens, torch.Tensor) and tokens.dim() >= 2:
        return tokens
    embeds = kwargs.get("inputs_embeds")
    if isinstance(embeds, torch.Tensor) and embeds.dim() >= 3:
        return embeds
    return None


def _kv_size(output: Any) -> KVCacheSize | None:
    cache = output_cache(output)
    return None if cache is None else measure(cache)


def _kv_bytes(output: Any) -> int:
    size = _kv_size(output)
    return 0 if size is None else size.bytes


class ForwardStart(NamedTuple):
    """What the forward pre-hook leaves for the post-hook of the same forward, in this thread."""

    placement: Placement
    batch: int  # sequences in the input
    new_tokens: int  # tokens per sequence the forward consumes (> 1: a prefill)
    mark: Any  # the clock mark recorded before the forward
    host: float  # perf_counter read just before the mark


class ForwardHooks:
    """The two forward hooks of one model, and their presence on it."""

    def __init__(self, model: ModelContext) -> None:
        self._model = model
        self._local = threading.local()
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._ids: tuple[int, int] = (-1, -1)  # (pre-hook, post-hook) ids in the model's hook dicts
        self._out = 0  # generates running with the hooks taken out (hide)
        self._held: tuple[Any, Any] | None = None  # the hooks while they are out

    def install(self, module: torch.nn.Module) -> None:
        self._handles = [
            module.register_forward_pre_hook(self.before, with_kwargs=True),
            module.register_forward_hook(self.after, with_kwargs=True),
        ]
        self._ids = (self._handles[0].id, self._handles[1].id)

    def remove(self) -> None:
        """Take the hooks off the model (under the model's lock, with ``active`` already False)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def hide(self, module: torch.nn.Module) -> bool:
        """Take the hooks out of the model's hook dicts, where they are its only ones, until :meth:`show`;
        True if they are out (or already were, for another generate).

        A module with forward hooks runs them through ``Module._call_impl``'s slow path, which generate's
        compiled call captures and replays every step: 25 µs per step on the CPU, even with hooks that
        trace to nothing (docs/benchmarks.md). Without them the call is exactly the one a bare model
        compiles, so instrument() and remove() never make dynamo compile again. Meanwhile another thread's
        forward of the same model is not timed; with hooks of the user's on the model, ours stay in and
        stand aside (ModelContext.timed_around, DecodeRun)."""
        model = self._model
        try:
            with model.lock:  # remove() takes it too: a hook it removed is never put back
                if not model.active:
                    return False
                if self._out == 0:
                    pre_hooks, post_hooks = module._forward_pre_hooks, module._forward_hooks
                    pre_id, post_id = self._ids
                    if len(pre_hooks) != 1 or len(post_hooks) != 1 or pre_id not in pre_hooks:
                        return False
                    self._held = (pre_hooks.pop(pre_id), post_hooks.pop(post_id))
                self._out += 1
                return True
        except Exception as exc:
            model.errors.report("forward_pre", exc)
            return False

    def show(self, module: torch.nn.Module | None) -> None:
        """Put the hooks back once the last generate that took them out has ended."""
        model = self._model
        try:
            with model.lock:
                self._out -= 1
                if self._out or self._held is None:
                    return
                (pre_hook, post_hook), self._held = self._held, None
                if model.active and module is not None:
                    pre_id, post_id = self._ids
                    module._forward_pre_hooks[pre_id] = pre_hook
                    module._forward_hooks[post_id] = post_hook
        except Exception as exc:
            model.errors.report("generate_exit", exc)

    def before(self, module: torch.nn.Module | None, args: tuple, kwargs: dict) -> None:
        """The pre-hook: the start mark and the input's shape."""
        # Traced by torch.compile around the module's __call__ where it is compiled with the hooks in (the
        # user's own torch.compile, or generate's with hooks of the user's on the model: hide): the
        # check folds to a constant, so the hook adds nothing to the graph and breaks nothing.
        model = self._model
        if torch.compiler.is_compiling() or not model.active or model.timed_around.get():
            return
        request = CURRENT_REQUEST.get()
        if request is not None and request.path.run is not None:  # timed from around the compiled call
            return  # (the post-hook finds no start and returns too)
        try:
            placement = model.placement
            tensor = input_tensor(args, kwargs)
            captures = model.captures
            if captures.armed:  # an on-demand profile (profiling/): one attribute read otherwise
                captures.boundary(tensor is not None and tensor.shape[1] > 1)
            if tensor is not None and tensor.device != placement.device:
                model.follow()
                placement = model.placement
            shape = (0, 0) if tensor is None else (tensor.shape[0], tensor.shape[1])
            start_host = time.perf_counter()  # read before the mark: no mark completes before this
            self._local.start = ForwardStart(
                placement, shape[0], shape[1], placement.clock.mark(), start_host
            )
        except Exception as exc:
            model.errors.report("forward_pre", exc)

    def after(self, module: torch.nn.Module | None, args: tuple, kwargs: dict, output: Any) -> None:
        """The post-hook: the end mark, the KV cache's size, and the step for its request."""
        model = self._model
        if torch.compiler.is_compiling() or not model.active or model.timed_around.get():
            return
        try:
            started = self._local.__dict__.pop("start", None)
            series = model.series
            series.heartbeat()
            if started is None:  # installed while this forward was running
                return
            placement, batch, new_tokens = started.placement, started.batch, started.new_tokens
            clock = placement.clock
            request = CURRENT_REQUEST.get()
            if request is not None and request.clock is not clock:
                request = None  # a tracked request on another clock: time the forward on its own
            if request is None:
                phase = "prefill" if new_tokens > 1 else "decode"
                kv_bytes = _kv_bytes(output) if phase == "decode" else 0
            else:
                phase = "prefill" if request.forwards == 0 else "decode"
                # Reading every layer's shapes costs microseconds per step on deep models: measure after
                # the prefill, the first decode step, then every KV_MEASURE_INTERVAL steps.
                # A preallocated (static) cache keeps its size: measured once.
                forwards = request.forwards
                if forwards < 2 or (forwards % KV_MEASURE_INTERVAL == 0 and not request.kv_static):
                    request.set_kv(_kv_size(output))
                kv_bytes = request.kv_bytes
            footprint = placement.footprint
            if phase == "decode":
                read_bytes, flops = footprint.decode_bytes(kv_bytes), 0.0
            else:
                read_bytes, flops = 0.0, footprint.prefill_flops(batch * new_tokens)
            # With sampled-token marks the criterion counts the tokens; else the forward's end does.
            owned = request is not None and request.owner is model
            tokens = 1 if owned and not request.path.marks_sampling else 0
            if request is not None:
                request.drain_batch()  # earlier steps, complete since generate's last synchronization
            # The end mark comes last: in a launch-bound step the device reaches it as soon as it is
            # recorded, so the hook's own bookkeeping before it counts as part of the step (the caller
            # waits for it too) instead of widening the gap to whoever reads the clock next.
            end_host = time.perf_counter()
            end = clock.mark()
            step = Step(
                series=series,
                device=placement.label,
                phase=phase,
                start=started.mark,
                end=end,
                tokens=tokens,
                start_host=started.host,
                end_host=end_host,
                read_bytes=read_bytes,
                flops=flops,
                batch=batch,
                processed=batch * new_tokens,
            )
            if request is None:
                model.background.resolve_or_defer(LooseForward(clock, step), model.errors)
            else:
                request.add(step)
        except Exception as exc:
            model.errors.report("forward_post", exc)
