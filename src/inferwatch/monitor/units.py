"""Human-readable figures: the same units in ``inferwatch top`` and ``inferwatch diagnose``."""

from __future__ import annotations


def percent(value: float) -> str:
    """``0.431`` -> ``43%``; small shares keep a decimal (``0.052`` -> ``5.2%``)."""
    return f"{value:.0%}" if abs(value) >= 0.1 else f"{value:.1%}"


def duration(seconds: float) -> str:
    """Seconds in the unit that keeps 3 significant figures readable: ``1.25 s``, ``12.3 ms``, ``85 µs``."""
    if abs(seconds) >= 1:
        return f"{seconds:.2f} s"
    if abs(seconds) >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} µs"


def size(num_bytes: float) -> str:
    """Bytes in binary units: ``1.50 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"


def number(value: float) -> str:
    """A count or rate with 3 significant figures (``1.23e+04`` avoided below a million)."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
