"""Tables laid out for a width: whole columns by priority, a name shortened in the middle but distinct."""

from __future__ import annotations

import io

from rich.console import Console
from rich.text import Text

from inferwatch.monitor.columns import Column, distinct_width, fit_table, shorten_middle

Row = tuple[str, str, str, str]
COLUMNS: tuple[Column[Row], ...] = (
    Column("model", lambda r: Text(r[0]), 0, essential=True, shortens=True),
    Column("detail", lambda r: Text(r[1]), 3),
    Column("TTFT", lambda r: Text(r[2]), 1, essential=True),
    Column("tok/s", lambda r: Text(r[3]), 2),
)
ROWS: tuple[Row, ...] = (
    ("meta-llama/Llama-3.1-8B-Instruct", "a long detail column", "18.8/39.5 ms", "13000.0"),
    ("meta-llama/Llama-3.1-70B-Instruct", "-", "850 ms/1.20 s", "13.0"),
)


def drawn(width: int) -> tuple[list[str], list[str], int]:
    fitted = fit_table(COLUMNS, ROWS, width)
    out = io.StringIO()
    Console(file=out, width=width).print(fitted.table)
    return [c.header for c in fitted.shown], out.getvalue().splitlines(), fitted.hidden


def test_shorten_middle_keeps_both_ends() -> None:
    assert shorten_middle("small-llama-llama", 13) == "small-…-llama"
    assert shorten_middle("small", 13) == "small"
    names = ["meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-70B-Instruct"]
    width = distinct_width(names, 10)
    assert len({shorten_middle(name, width) for name in names}) == 2
    assert (
        len({shorten_middle(name, width - 1) for name in names}) == 1
    )  # the narrowest that tells them apart


def test_wide_enough_shows_everything_whole() -> None:
    headers, lines, hidden = drawn(120)
    assert headers == ["model", "detail", "TTFT", "tok/s"] and hidden == 0
    assert "meta-llama/Llama-3.1-70B-Instruct" in "\n".join(lines)


def test_narrow_leaves_out_the_least_important_and_never_cuts_a_figure() -> None:
    headers, lines, hidden = drawn(60)
    assert headers == ["model", "TTFT", "tok/s"] and hidden == 1  # in table order, detail left out
    text = "\n".join(lines)
    assert "13000.0" in text and "850 ms/1.20 s" in text and "…" not in text
    assert all(len(line) <= 60 for line in lines)


def test_an_essential_column_shortens_the_name_instead_of_being_left_out() -> None:
    headers, lines, hidden = drawn(40)
    assert headers == ["model", "TTFT"] and hidden == 2
    text = "\n".join(lines)
    assert "18.8/39.5 ms" in text and "850 ms/1.20 s" in text
    names = [line.split()[0] for line in lines[2:]]
    assert all("…" in name for name in names) and len(set(names)) == 2
    assert all(len(line) <= 40 for line in lines)
