"""The benchmark's own error: a model, device or option ``inferwatch bench``/``compare`` cannot use.

The ``inferwatch`` dispatcher prints it in one line and exits with status 2 (each subcommand module names
it in ``USAGE_ERRORS``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """An unknown model, an unusable device, a missing optional package or a value out of range."""
