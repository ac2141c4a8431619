"""The exporter's own errors: bad configuration and an address it cannot listen on.

Both mean "the exporter cannot start as configured". An embedding program catches them as what they
are (a ``ValueError`` and an ``OSError``); ``inferwatch-exporter`` (:mod:`.__main__`) prints the message
in one line and exits with status 2.
"""

from __future__ import annotations

# One class for a bad flag and a bad web config file (which the instrumentation endpoint reads too).
from inferwatch.common.webconfig import ConfigError

__all__ = ["ConfigError", "ListenError"]


class ListenError(OSError):
    """The HTTP endpoint cannot listen on the address asked for (taken, not local, not permitted).

    ``errno`` is the bind's; ``strerror`` is the one-line message, naming the address and the reason.
    """
