"""Content negotiation for the metrics endpoints: which format and whether gzip, by the client's ``q`` values.

RFC 9110 (12.5.1, 12.5.3): each entry of ``Accept`` / ``Accept-Encoding`` may carry a weight ``q`` from
0 to 1 (1 when absent); 0 means "not acceptable"; a specific entry (``text/plain``) overrides a range
(``text/*``, ``*/*``) for the types it names. Prometheus asks for OpenMetrics with a higher ``q`` than the
text format (``application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5,*/*;q=0.1``); a
client that gives both the same weight gets the one it listed first, and one that names neither gets the
first offered type it does not refuse (the text format, as with prometheus_client, unless it refuses that
one). A client that refuses every offered type (``*/*;q=0``, or each one named with ``q=0``) is answered
406 Not Acceptable (:class:`NotAcceptable`): it said it cannot use any of them, unlike one that named none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

OPENMETRICS = "application/openmetrics-text"
TEXT = "text/plain"


class NotAcceptable(Exception):
    """The ``Accept`` header refuses every offered media type (``q=0``): the answer is 406, no body format."""

    def __init__(self, offered: Sequence[str]) -> None:
        # The message is the 406 body: the formats on offer, for the client to ask for one (RFC 9110 15.5.7).
        super().__init__(
            f"Not acceptable: the Accept header refuses (q=0) every format offered: {', '.join(offered)}"
        )


@dataclass(frozen=True)
class _Entry:
    media_type: str  # lower-cased, e.g. "text/plain", "text/*", "*/*"
    text: str  # the entry as sent, without its q parameter (the version and escaping stay)
    q: float
    position: int


def _weight(value: str) -> float:
    try:
        q = float(value)
    except ValueError:
        return 0.0  # a malformed weight is no promise of acceptability
    return min(max(q, 0.0), 1.0)


def _entries(header: str | None) -> list[_Entry]:
    entries = []
    for position, raw in enumerate((header or "").split(",")):
        media_type, *params = (part.strip() for part in raw.split(";"))
        if not media_type:
            continue
        q, kept = 1.0, []
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                q = _weight(value.strip())
            elif param:
                kept.append(param)
        entries.append(_Entry(media_type.lower(), ";".join([media_type, *kept]), q, position))
    return entries


def _match(entries: list[_Entry], names: Sequence[str]) -> _Entry | None:
    """The heaviest entry (the first of equals) among those naming exactly one of ``names``."""
    found = [e for e in entries if e.media_type in names]
    return max(found, key=lambda e: (e.q, -e.position)) if found else None


def choose_media_type(accept: str | None, offered: Sequence[str]) -> tuple[str, str]:
    """The offered media type ``accept`` prefers, with the entry that chose it (its parameters, such as
    ``version=``, without ``q``; the bare type when a range such as ``*/*`` chose it, or none did).

    A header that names none of them acceptably (absent, empty, only other types) gets the first offered
    type it does not refuse: RFC 9110 lets a server disregard such a header rather than answer 406. One
    that refuses every offered type raises :class:`NotAcceptable`.
    """
    entries = _entries(accept)
    best: tuple[tuple[float, int, int], str, str] | None = None
    unrefused: list[str] = []
    for rank, media_type in enumerate(offered):
        major = media_type.split("/")[0]
        # The most specific entry decides: the type itself, else its major range, else */*.
        entry = (
            _match(entries, (media_type,)) or _match(entries, (f"{major}/*",)) or _match(entries, ("*/*",))
        )
        if entry is None:
            unrefused.append(media_type)
            continue
        if entry.q <= 0:
            continue
        named = entry.media_type == media_type
        # Heavier first; among equals, an entry naming the type before a range, then the earlier entry,
        # then the earlier offer.
        key = (entry.q, named, -entry.position if named else -rank)
        if best is None or key > best[0]:
            best = (key, media_type, entry.text if named else media_type)
    if best is not None:
        return best[1], best[2]
    if not unrefused:
        raise NotAcceptable(offered)
    return unrefused[0], unrefused[0]


def prefers_openmetrics(accept: str | None) -> bool:
    """Whether to answer OpenMetrics rather than the text format (0.0.4) to this ``Accept`` header;
    raises :class:`NotAcceptable` when it refuses both."""
    return choose_media_type(accept, (TEXT, OPENMETRICS))[0] == OPENMETRICS


def gzip_acceptable(accept_encoding: str | None) -> bool:
    """Whether ``Accept-Encoding`` accepts gzip: named (or ``*``) with a weight above zero."""
    weights: dict[str, float] = {}
    for raw in (accept_encoding or "").split(","):
        coding, *params = (part.strip() for part in raw.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                q = _weight(value.strip())
        if coding:
            weights.setdefault(coding.lower(), q)
    for name in ("gzip", "x-gzip"):
        if name in weights:
            return weights[name] > 0
    return weights.get("*", 0.0) > 0
