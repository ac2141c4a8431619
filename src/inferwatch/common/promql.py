"""One PromQL vocabulary for the alerts, the dashboards and the monitor: typed expressions, rendered once.

Expressions are values (frozen dataclasses: equal when they say the same, usable as cache keys), built
from selectors with a few functions - :func:`rate`, :func:`aggregate`, :func:`histogram_quantile`,
:func:`histogram_mean` - Python's arithmetic, and methods for comparisons (``gt``, ``lt`` ...) and set
operators (``and_``, ``or_``, ``unless``)::

    ttft = Selector("llm_time_to_first_token_seconds", parse_matchers('job="llm"'))
    histogram_quantile(0.99, ttft, ("job", "model")).gt(1.0).render("5m")
    # histogram_quantile(0.99, sum by (job, model, le) (rate(..._bucket{job="llm"}[5m]))) > 1

A range that names no window of its own takes the one given to :meth:`Expr.render`: the monitor renders
with its ``--rate-window``, the dashboards with Grafana's ``$__rate_interval``, a rule with its configured
window. Templates are values too: a Grafana variable is a matcher's value (``model=~"$model"``), a
configured selector is parsed into matchers (:func:`parse_matchers`). :meth:`Expr.render` writes one line
(for Grafana's JSON); :meth:`Expr.pretty` breaks what does not fit in :data:`WIDTH` columns the way
Prometheus's own formatter does, operator on its own line and operands indented (for rule files and the
evidence a diagnosis shows).

The grouping convention: :data:`PER_MODEL`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, NamedTuple

# Every per-model percentile, mean and ratio is computed per scrape target and model: the labels that
# identify one model in one serving process. Recording rules record at this level, alerts judge at it,
# dashboards plot it and the monitor reports it, so a panel's line is the series an alert fires on and a
# replica that misbehaves is not averaged away by the healthy ones. Whoever wants fewer groups sums the
# parts up (bucket rates, rates of _sum and _count), never the quantiles or ratios themselves.
PER_MODEL = ("job", "instance", "model")
# One scrape target: what per-process and per-exporter series are matched and counted by.
PER_TARGET = ("job", "instance")

# Lines of a pretty-printed expression stay within this many columns where they can.
WIDTH = 100

Operator = Literal["=", "!=", "=~", "!~"]
# Binary operators from the weakest to the strongest binding (PromQL's precedence).
_PRECEDENCE = {
    "or": 1,
    "and": 2,
    "unless": 2,
    **dict.fromkeys(("==", "!=", "<", "<=", ">", ">="), 3),
    "+": 4,
    "-": 4,
    "*": 5,
    "/": 5,
    "%": 5,
}
_ATOM = 10

_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def num(value: float) -> str:
    """A number as PromQL reads it, without float noise (0.144, not 0.14400000000000002)."""
    return format(value, ".12g")


class Matcher(NamedTuple):
    """One label matcher; ``value`` is the string itself (a regex for ``=~``), unescaped."""

    name: str
    value: str
    op: Operator = "="

    def render(self) -> str:
        escaped = self.value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{self.name}{self.op}"{escaped}"'


def parse_matchers(text: str) -> tuple[Matcher, ...]:
    """The matchers of a configured selector as written inside PromQL braces (``job="llm", env=~"p.*"``);
    raises ValueError for anything else."""
    text = text.strip()
    found, position = [], 0
    while position < len(text):
        match = _MATCHER.match(text, position)
        if match is None:
            raise ValueError(f"not PromQL label matchers: {text!r}")
        name, op, value = match.groups()
        found.append(Matcher(name, re.sub(r"\\(.)", r"\1", value), op))
        position = match.end()
    return tuple(found)


def one_of(values: Iterable[object]) -> str:
    """A regex alternation of ``values`` (for a ``=~`` matcher)."""
    return "|".join(str(value) for value in values)


def _operator(op: str) -> Callable[[Expr, Expr | float], Binary]:
    """The method of :class:`Expr` that applies binary operator ``op`` (a number becomes a literal)."""

    def apply(self: Expr, other: Expr | float) -> Binary:
        return self._binary(op, other)

    apply.__doc__ = f"``self {op} other``."
    return apply


class Expr:
    """A PromQL expression. Subclasses render themselves; this base adds the operators: arithmetic as
    Python's, comparisons as methods (``==`` stays the equality of two expressions)."""

    precedence = _ATOM
    __add__ = _operator("+")
    __sub__ = _operator("-")
    __truediv__ = _operator("/")
    gt = _operator(">")
    lt = _operator("<")
    le = _operator("<=")
    eq = _operator("==")

    def render(self, rate_window: str | None = None) -> str:
        """The expression on one line; ranges without a window of their own use ``rate_window``."""
        raise NotImplementedError

    def pretty(self, rate_window: str | None = None, indent: int = 0) -> str:
        """The expression broken over lines where one does not fit :data:`WIDTH` columns."""
        flat = self.render(rate_window)
        if indent + len(flat) <= WIDTH:
            return flat
        return self._broken(rate_window, indent)

    def _broken(self, rate_window: str | None, indent: int) -> str:
        """The expression over several lines; atoms cannot be broken."""
        return self.render(rate_window)

    def _binary(self, op: str, other: Expr | float, matching: Matching | None = None) -> Binary:
        return Binary(op, self, other if isinstance(other, Expr) else Number(other), matching)

    def __rsub__(self, other: float) -> Binary:
        return Number(other)._binary("-", self)

    def __rmul__(self, other: float) -> Binary:
        return Number(other)._binary("*", self)

    def minus(self, other: Expr, matching: Matching) -> Binary:
        """``self - other`` with vector matching (``ignoring``/``on``)."""
        return self._binary("-", other, matching)

    def times(self, other: Expr, matching: Matching) -> Binary:
        """``self * other`` with vector matching (``on (...) group_left (...)``)."""
        return self._binary("*", other, matching)

    def and_(self, other: Expr, on: tuple[str, ...] | None = None) -> Binary:
        return self._binary("and", other, None if on is None else Matching(on))

    def or_(self, other: Expr, on: tuple[str, ...] | None = None) -> Binary:
        return self._binary("or", other, None if on is None else Matching(on))

    def unless(self, other: Expr) -> Binary:
        return self._binary("unless", other)


@dataclass(frozen=True)
class Number(Expr):
    value: float

    def render(self, rate_window: str | None = None) -> str:
        return num(self.value)


@dataclass(frozen=True)
class Selector(Expr):
    """An instant vector selector: ``gpu_clock_hz{job="x", clock="sm"}``."""

    metric: str
    matchers: tuple[Matcher, ...] = ()

    def suffixed(self, suffix: str) -> Selector:
        """The same matchers on another series of the family (``_bucket``, ``_sum``, ``_count``)."""
        return Selector(self.metric + suffix, self.matchers)

    def render(self, rate_window: str | None = None) -> str:
        if not self.matchers:
            return self.metric
        return f"{self.metric}{{{', '.join(m.render() for m in self.matchers)}}}"


def eq(name: str, value: str) -> Matcher:
    return Matcher(name, value, "=")


def ne(name: str, value: str) -> Matcher:
    return Matcher(name, value, "!=")


def regex(name: str, value: str) -> Matcher:
    return Matcher(name, value, "=~")


@dataclass(frozen=True)
class Offset(Expr):
    """``selector offset duration``, an instant vector from the past."""

    selector: Selector
    duration: str

    def render(self, rate_window: str | None = None) -> str:
        return f"{self.selector.render()} offset {self.duration}"


@dataclass(frozen=True)
class Range(Expr):
    """``selector[window]`` (optionally ``offset``); without a window, the one rendering supplies."""

    selector: Selector
    window: str | None = None
    offset: str | None = None

    def render(self, rate_window: str | None = None) -> str:
        window = self.window or rate_window
        if window is None:
            raise ValueError(f"the range of {self.selector.render()} has no window")
        shifted = f" offset {self.offset}" if self.offset else ""
        return f"{self.selector.render()}[{window}]{shifted}"


@dataclass(frozen=True)
class Subquery(Expr):
    """``(expr)[window:resolution]``: ``expr`` evaluated at each step of the window."""

    expr: Expr
    window: str
    resolution: str | None = None

    def render(self, rate_window: str | None = None) -> str:
        resolution = self.resolution or rate_window or ""
        inner = self.expr.render(rate_window)
        inner = inner if isinstance(self.expr, (Selector, Aggregate, Call)) else f"({inner})"
        return f"{inner}[{self.window}:{resolution}]"


@dataclass(frozen=True)
class Call(Expr):
    """A function call: ``rate(x[5m])``, ``histogram_quantile(0.9, ...)``, ``time()``."""

    function: str
    args: tuple[Expr, ...] = ()

    def render(self, rate_window: str | None = None) -> str:
        return f"{self.function}({', '.join(arg.render(rate_window) for arg in self.args)})"

    def _broken(self, rate_window: str | None, indent: int) -> str:
        pad = " " * (indent + 2)
        args = ",\n".join(pad + arg.pretty(rate_window, indent + 2) for arg in self.args)
        return f"{self.function}(\n{args}\n{' ' * indent})"


@dataclass(frozen=True)
class Aggregate(Expr):
    """``op by (labels) (expr)``; ``by=None`` aggregates everything into one series."""

    op: str
    expr: Expr
    by: tuple[str, ...] | None = None

    def _head(self) -> str:
        return self.op if self.by is None else f"{self.op} by ({', '.join(self.by)})"

    def render(self, rate_window: str | None = None) -> str:
        return f"{self._head()} ({self.expr.render(rate_window)})"

    def _broken(self, rate_window: str | None, indent: int) -> str:
        inner = self.expr.pretty(rate_window, indent + 2)
        return f"{self._head()} (\n{' ' * (indent + 2)}{inner}\n{' ' * indent})"


@dataclass(frozen=True)
class Matching:
    """Vector matching of a binary operation: ``on (...)`` or ``ignoring (...)``, then ``group_left``."""

    labels: tuple[str, ...]
    ignoring: bool = False
    group_left: tuple[str, ...] | None = None

    def render(self) -> str:
        text = f"{'ignoring' if self.ignoring else 'on'} ({', '.join(self.labels)})"
        if self.group_left is not None:
            text += f" group_left ({', '.join(self.group_left)})"
        return text


@dataclass(frozen=True)
class Binary(Expr):
    """``left op right``, parenthesised where PromQL's precedence needs it."""

    op: str
    left: Expr
    right: Expr
    matching: Matching | None = None

    @property
    def precedence(self) -> int:
        return _PRECEDENCE[self.op]

    def _operator(self) -> str:
        return self.op if self.matching is None else f"{self.op} {self.matching.render()}"

    def _needs_parentheses(self, operand: Expr, right: bool) -> bool:
        # Left-associative: an operand of the same precedence is grouped on the right side only.
        return operand.precedence < self.precedence or (right and operand.precedence == self.precedence)

    def _operand(self, operand: Expr, right: bool, rate_window: str | None) -> str:
        text = operand.render(rate_window)
        return f"({text})" if self._needs_parentheses(operand, right) else text

    def render(self, rate_window: str | None = None) -> str:
        left = self._operand(self.left, False, rate_window)
        right = self._operand(self.right, True, rate_window)
        return f"{left} {self._operator()} {right}"

    def _broken_operand(self, operand: Expr, right: bool, rate_window: str | None, indent: int) -> str:
        # Broken over lines, an operand of another precedence is parenthesised even where PromQL does not
        # need it, so that the lines show what binds to what.
        grouped = self._needs_parentheses(operand, right) or (
            isinstance(operand, Binary) and operand.precedence != self.precedence
        )
        if not grouped:
            return operand.pretty(rate_window, indent)
        flat = operand.render(rate_window)
        if indent + len(flat) + 2 <= WIDTH:
            return f"({flat})"
        inner = operand.pretty(rate_window, indent + 2)
        return f"(\n{' ' * (indent + 2)}{inner}\n{' ' * indent})"

    def _broken(self, rate_window: str | None, indent: int) -> str:
        pad = " " * indent
        left = self._broken_operand(self.left, False, rate_window, indent)
        right = self._broken_operand(self.right, True, rate_window, indent)
        operator = self._operator()
        if "\n" not in right and indent + len(operator) + 1 + len(right) <= WIDTH:
            return f"{left}\n{pad}{operator} {right}"
        return f"{left}\n{pad}{operator}\n{pad}{right}"


# --- the shapes every consumer writes the same way -------------------------------------------------------


def rate(selector: Selector, window: str | None = None, offset: str | None = None) -> Call:
    """``rate(selector[window])``: a counter's per-second increase."""
    return Call("rate", (Range(selector, window, offset),))


def increase(selector: Selector, window: str | None = None) -> Call:
    """``increase(selector[window])``: a counter's increase over the window."""
    return Call("increase", (Range(selector, window),))


def over_time(
    function: str, selector: Selector, window: str | None = None, offset: str | None = None
) -> Call:
    """``<function>_over_time(selector[window])``: ``avg``, ``min``, ``max``, ``stddev`` ..."""
    return Call(f"{function}_over_time", (Range(selector, window, offset),))


def aggregate(op: str, expr: Expr, by: tuple[str, ...] | None) -> Aggregate:
    """``op by (by) (expr)``."""
    return Aggregate(op, expr, by)


def sum_rate(selector: Selector, by: tuple[str, ...] | None, window: str | None = None) -> Aggregate:
    """``sum by (by) (rate(selector[window]))``: the rate of a counter over the series of each group."""
    return Aggregate("sum", rate(selector, window), by)


def histogram_quantile(q: float, histogram: Selector, by: tuple[str, ...], window: str | None = None) -> Call:
    """The ``q`` quantile of ``histogram`` (its base name) per ``by``: the bucket rates summed by ``by``
    and ``le`` first, the quantile of the sums after (quantiles are never averaged or added)."""
    buckets = sum_rate(histogram.suffixed("_bucket"), (*by, "le"), window)
    return Call("histogram_quantile", (Number(q), buckets))


def histogram_mean(histogram: Selector, by: tuple[str, ...], window: str | None = None) -> Binary:
    """The mean observation of ``histogram`` per ``by``: summed rate of ``_sum`` over summed rate of
    ``_count`` (never an average of averages)."""
    return ratio_of_rates(histogram.suffixed("_sum"), histogram.suffixed("_count"), by, window)


def ratio_of_rates(
    numerator: Selector, denominator: Selector, by: tuple[str, ...], window: str | None = None
) -> Binary:
    """Per ``by``: summed rate of ``numerator`` over summed rate of ``denominator``."""
    return sum_rate(numerator, by, window) / sum_rate(denominator, by, window)


def coefficient_of_variation(series: Selector, window: str, resolution: str | None = None) -> Binary:
    """Standard deviation over mean of ``series`` over ``window``; with a ``resolution``, of a subquery
    that samples ``series`` at that step instead of every sample in the window."""
    if resolution is None:
        return over_time("stddev", series, window) / over_time("avg", series, window)
    sampled = Subquery(series, window, resolution)
    return Call("stddev_over_time", (sampled,)) / Call("avg_over_time", (sampled,))


def time() -> Call:
    return Call("time")
