"""Tables that fit a terminal by leaving columns out, never by cutting a value.

rich shrinks every column of a table that is too wide, with an ellipsis, until it fits: ``13…`` could be
13 or 13 000. Here a table is laid out for a width instead: its columns are taken in priority order while
they fit whole (header and every value) and the rest are left out and counted, like htop or
``kubectl top``. One column may shorten its values in the middle (a model's name: ``small-…-llama``),
never below the width at which two different values would look the same.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich import box
from rich.table import Table
from rich.text import Text

Row = TypeVar("Row")

#: Between two columns: one space of padding and the (blank) divider of ``box.SIMPLE_HEAD``.
COLUMN_GAP = 2
#: A shortened value keeps at least this many characters (more where that is needed to tell two apart).
SHORTEST_NAME = 10
ELLIPSIS = "…"


@dataclass(frozen=True)
class Column(Generic[Row]):
    """One column: its header, how a row's value is drawn, and how much it matters.

    ``priority``: lower is kept longer; a table shows a prefix of its columns sorted by priority, in their
    own order. ``essential`` columns may shorten the ``shortens`` column to fit; the others are shown only
    where they fit beside its whole values.
    """

    header: str
    cell: Callable[[Row], Text]
    priority: int
    essential: bool = False
    shortens: bool = False


@dataclass(frozen=True)
class Fitted(Generic[Row]):
    """A table laid out for a width: the columns shown, in table order, and how many were left out."""

    table: Table
    shown: tuple[Column[Row], ...]
    hidden: int


def shorten_middle(value: str, width: int) -> str:
    """``value`` in ``width`` characters, its middle replaced by an ellipsis: ``small-…-llama``."""
    if len(value) <= width:
        return value
    head = width // 2
    tail = width - 1 - head
    return value[:head] + ELLIPSIS + (value[-tail:] if tail else "")


def distinct_width(values: Sequence[str], floor: int) -> int:
    """The narrowest width, from ``floor`` up, at which the shortened ``values`` stay distinct."""
    longest = max((len(v) for v in values), default=0)
    for width in range(min(floor, longest), longest):
        if len({shorten_middle(v, width) for v in values}) == len(set(values)):
            return width
    return longest


def _header_width(column: Column[Any]) -> int:
    return max(len(line) for line in column.header.splitlines())


def _table_width(widths: Sequence[int]) -> int:
    return sum(widths) + COLUMN_GAP * max(0, len(widths) - 1)


def fit_table(columns: Sequence[Column[Row]], rows: Sequence[Row], width: int) -> Fitted[Row]:
    """The table of ``rows`` with those of ``columns`` that fit ``width`` whole, by priority."""
    cells = {id(column): [column.cell(row) for row in rows] for column in columns}
    natural = {
        id(column): max([_header_width(column), *(cell.cell_len for cell in cells[id(column)])])
        for column in columns
    }
    shortening = next((column for column in columns if column.shortens), None)
    floor = {id(column): natural[id(column)] for column in columns}
    if shortening is not None:
        names = [cell.plain for cell in cells[id(shortening)]]
        floor[id(shortening)] = max(_header_width(shortening), distinct_width(names, SHORTEST_NAME))

    chosen: list[Column[Row]] = []
    for column in sorted(columns, key=lambda c: c.priority):
        trial = [*chosen, column]
        # An essential column may push the shortening one down to its floor; any other needs room beside
        # the whole values.
        widths = [(floor if column.essential else natural)[id(c)] for c in trial]
        if chosen and _table_width(widths) > width:
            break
        chosen = trial
    kept = {id(column) for column in chosen}
    shown = tuple(column for column in columns if id(column) in kept)

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))
    for column in shown:
        table.add_column(column.header, no_wrap=True)
    # What the shortening column may take: all that the others leave, down to its floor.
    others = _table_width([natural[id(c)] for c in shown if c is not shortening]) + COLUMN_GAP
    room = max(floor[id(shortening)], min(natural[id(shortening)], width - others)) if shortening else 0
    for index in range(len(rows)):
        row = []
        for column in shown:
            cell = cells[id(column)][index]
            if column is shortening:
                cell = Text(shorten_middle(cell.plain, room), style=cell.style)
            row.append(cell)
        table.add_row(*row)
    return Fitted(table, shown, len(columns) - len(shown))
