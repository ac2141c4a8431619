"""transformers' continuous batching in tests: a page pool sized for a test, not for the host."""

from __future__ import annotations

from transformers.generation.configuration_utils import ContinuousBatchingConfig


def small_page_pool() -> ContinuousBatchingConfig:
    """Pages from 0.5 % of the device's memory, for steps of up to 1024 tokens. Left to itself, transformers
    sizes the pool (and the step) from 60-90 % of the memory: 14 GB of this 24 GB CPU host, which a loaded
    machine takes minutes to hand over, or the kernel ends the process for."""
    return ContinuousBatchingConfig(max_batch_tokens=1024, max_memory_percent=0.005)
