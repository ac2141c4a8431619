"""A continuous-batching manager's paged KV cache, read from transformers' host-side bookkeeping.

:mod:`.manager` attaches a :class:`PagedCacheView` to every batch processor
it follows; the background sampler reads it (``ModelSeries.poll_paged_cache``), never the hot path.
"""

from __future__ import annotations

import math
import weakref
from typing import Any


class PagedReading:
    """What the blocks of a paged KV cache hold at one reading, in bytes of its pool."""

    __slots__ = ("prefix_cached_bytes", "used_bytes")

    def __init__(self, used_bytes: float, prefix_cached_bytes: float) -> None:
        #: Held by requests: running, prefilling, or waiting for their next step.
        self.used_bytes = used_bytes
        #: Complete blocks no request holds, kept for a later prompt that starts with the same tokens.
        self.prefix_cached_bytes = prefix_cached_bytes


class PagedCacheView:
    """The paged KV cache of a batch processor, read by the background sampler (never by the hot path).

    Everything is host-side bookkeeping: the layout is read once from tensor shapes and sizes (never their
    data), the blocks' states at each reading from the cache's free lists and prefix-cache ledger (lengths
    of Python containers: no device read, no synchronization, no lock the manager's thread takes). The cache
    is held weakly. Its pool is what holds tokens: transformers allocates two more blocks (5.17) or sectors
    (5.24) that padding tokens read and write, never a request, so they are not part of it.

    * 5.17: ``key_cache``/``value_cache`` hold one tensor per layer of a layer group, of
      ``(num_blocks + 2) * block_size`` slots; a block is ``block_size`` tokens of one group, and a token of
      a sequence takes one slot of every group. ``_block_manager`` lists the uninitialized (free) blocks and
      the initialized ones: complete blocks no request holds, hashed for prefix sharing, which it hands to a
      request that needs room (``has_enough_free_blocks``).
    * 5.24: one ``cache_tensor`` of two trash sectors and ``num_sectors`` sectors, carved into blocks by one
      allocator per attention type; ``num_blocks`` counts blocks of ``page_size`` tokens of every layer.
      Free are the free sectors and the free blocks of assigned ones (``compute_free_capacity``); each
      allocator's ledger keeps ``cached_blocks``, complete blocks no request holds, which the scheduler
      evicts for requests that need room (below its safety margin, and before it offloads a request).
    """

    def __init__(self, cache: Any) -> None:
        self._cache = weakref.ref(cache)
        self.total_blocks = int(cache.num_blocks)
        self.prefix_sharing = bool(getattr(cache, "use_prefix_sharing", False))
        allocators = getattr(cache, "cache_allocators", None)
        if allocators is not None:  # 5.24
            self._allocators = tuple(allocators.values())
            #: Bytes one token of one sequence takes: a page holds tokens_per_page tokens of one layer.
            self.bytes_per_token = sum(a.bytes_per_block // a.tokens_per_page for a in self._allocators)
            self.capacity_bytes = int(cache.num_sectors) * int(cache.bytes_per_sector)
            self.block_bytes = self.bytes_per_token * self._allocators[0].tokens_per_page
            self._read = self._read_sectors
        else:  # 5.17
            keys = cache.key_cache[0]  # [slots, kv_heads, head_dim]: one slot of one layer, keys and values
            token_bytes = 2 * math.prod(keys.shape[1:]) * keys.element_size()
            group_layers = len(cache.key_cache)
            self.block_bytes = token_bytes * group_layers * int(cache.block_size)
            self.bytes_per_token = token_bytes * group_layers * len(cache.group_cache_managers)
            self.capacity_bytes = self.total_blocks * self.block_bytes
            self._read = self._read_blocks
        #: Tokens of one sequence the pool holds, at bytes_per_token each.
        self.capacity_tokens = self.capacity_bytes // self.bytes_per_token

    def read(self) -> PagedReading | None:
        """The blocks' states now; None once the cache is gone."""
        cache = self._cache()
        return None if cache is None else self._read(cache)

    def _read_sectors(self, cache: Any) -> PagedReading:
        free = float(cache.compute_free_capacity(relative=False))
        cached = float(sum(len(a.ledger.cached_blocks) * a.bytes_per_block for a in self._allocators))
        return self._reading(self.capacity_bytes - free - cached, cached)

    def _read_blocks(self, cache: Any) -> PagedReading:
        manager = cache._block_manager
        free, cached = len(manager._uninit_block_ids), len(manager._init_block_ids)
        used = self.total_blocks - free - cached
        return self._reading(used * self.block_bytes, cached * self.block_bytes)

    def _reading(self, used: float, cached: float) -> PagedReading:
        # The manager's thread moves blocks between the lists while they are read one after the other.
        cached = min(max(0.0, cached), self.capacity_bytes)
        return PagedReading(min(max(0.0, used), self.capacity_bytes - cached), cached)
