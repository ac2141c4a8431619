"""The serving side as real processes: ``inferwatch demo``, ``inferwatch run`` and multiprocess workers."""
