"""Durations, written the way Prometheus writes them: ``500ms``, ``30s``, ``5m``, ``1h30m``, ``1d``.

One parser for every duration inferwatch reads: the exporter's flags and variables, ``inferwatch
diagnose``'s options and the alert configuration. Two dialects of one syntax:

* Prometheus's own (``promql=True``): whole amounts with units from years down to milliseconds, largest
  first, each unit at most once (``1h30m``, ``90s``, ``0s``). The alert configuration uses it because its
  durations go into the rule file as written, where Prometheus parses them.
* what a person may type on a command line (the default): the same, plus decimal amounts (``1.5s``,
  ``.5h``) and a bare number of seconds (``3``); the duration must be above zero.
"""

from __future__ import annotations

import re

# Seconds per unit, largest first: the order in which units must appear.
_UNIT_SECONDS = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1, "ms": 0.001}
_UNIT_RANK = {unit: rank for rank, unit in enumerate(_UNIT_SECONDS)}
_NUMBER = r"\d+(?:\.\d*)?|\.\d+"
_BARE_SECONDS = re.compile(_NUMBER)
_PART = re.compile(rf"({_NUMBER})(ms|[ywdhms])")


def parse_duration(text: str, *, promql: bool = False) -> float:
    """Seconds in ``text``; ValueError, naming ``text``, when it is not a duration of the dialect."""
    if not promql:
        seconds = float(text) if _BARE_SECONDS.fullmatch(text.strip()) else _sum_of_parts(text.strip(), text)
        if seconds <= 0:
            raise ValueError(f"{text!r} must be above zero")
        return seconds
    return _sum_of_parts(text, text, whole_amounts=True)


def _sum_of_parts(stripped: str, text: str, *, whole_amounts: bool = False) -> float:
    seconds, position, rank = 0.0, 0, -1
    for part in _PART.finditer(stripped):
        amount, unit = part.groups()
        if part.start() != position or _UNIT_RANK[unit] <= rank or (whole_amounts and not amount.isdigit()):
            break
        seconds += float(amount) * _UNIT_SECONDS[unit]
        position, rank = part.end(), _UNIT_RANK[unit]
    if position == 0 or position != len(stripped):
        raise ValueError(f"{text!r} is not a duration (examples: 500ms, 1s, 2m)")
    return seconds
