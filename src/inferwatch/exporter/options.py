"""What a flag is (:class:`Option`) and the parsers of its values, shared by the exporter's own flags
(:mod:`.config`) and those each collector declares with its registration (:mod:`.collectors.registry`).

Every parser takes the text of a flag or of its environment variable and raises ``ValueError`` with a
message that reads well after "flag: ".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from inferwatch.common.durations import parse_duration

ENV_PREFIX = "INFERWATCH_EXPORTER_"


@dataclass(frozen=True)
class Option:
    """One flag: the field its value goes to, how it is parsed, its default. The field is one of
    :class:`~.config.ExporterConfig` for the exporter's own flags, one of the collector's settings for the
    options a collector declares (:class:`~.collectors.registry.Registration`).

    ``kind`` is ``value`` (``--flag VALUE``), ``bool`` (``--flag`` / ``--no-flag``), ``append``
    (repeatable) or ``collector`` (``--collector.NAME`` / ``--no-collector.NAME``: ``field`` is the
    collector's name, and the value says whether it runs). ``aliases`` are older spellings, accepted too.
    """

    flag: str
    field: str
    parse: Callable[[str], Any]
    default: str
    help: str
    kind: Literal["value", "bool", "append", "collector"] = "value"
    metavar: str | None = None
    default_help: str = ""  # how --help shows the default, where the raw default says little
    aliases: tuple[str, ...] = ()

    @property
    def env(self) -> str:
        return ENV_PREFIX + re.sub(r"[.-]", "_", self.flag.lstrip("-")).upper()


def bounded_duration(low: str, high: str) -> Callable[[str], float]:
    """A parser of durations from ``low`` to ``high`` (both written as durations, and included).

    Outside sane limits a duration is a mistake, not a setting: a 1 ms poll interval burns a core and
    floods the log, and one of 99999999999h overflows the thread waits it becomes.
    """
    lowest, highest = parse_duration(low), parse_duration(high)

    def parse(value: str) -> float:
        seconds = parse_duration(value)
        if not lowest <= seconds <= highest:
            raise ValueError(f"{value!r} is outside {low} to {high}")
        return seconds

    return parse


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{value!r} is not a boolean (true/false)")


def parse_count(value: str) -> int:
    if not value.strip().isdigit():
        raise ValueError(f"{value!r} is not a whole number >= 0")
    return int(value)


def parse_pattern(value: str) -> re.Pattern[str] | None:
    if not value:
        return None
    try:
        return re.compile(value)
    except re.error as exc:
        raise ValueError(f"{value!r} is not a regular expression: {exc}") from None


def parse_path_list(value: str) -> tuple[str, ...]:
    return tuple(path for path in value.split(",") if path)
