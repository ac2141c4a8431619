"""The monitor's own error: options of ``inferwatch top`` or ``inferwatch diagnose`` that cannot work.

The ``inferwatch`` dispatcher prints it in one line and exits with status 2 (each subcommand module names
it in ``USAGE_ERRORS``).
"""

from __future__ import annotations


class ConfigError(ValueError):
    """Options that cannot work together or a value out of range; the message names the option."""
