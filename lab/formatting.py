"""Numbers as the lab prints them in tables and summaries, with "n/a" where a run has none.

A run that stopped before its first evaluation has no test accuracy, one that ran too few steps
past warm-up no throughput: the summary holds None, and a table says "n/a" rather than failing.
"""

from __future__ import annotations

MISSING = "n/a"


def pct(value: float | None) -> str:
    """A ratio (0..1) as a percentage with two decimals.

    >>> pct(0.9315), pct(1), pct(None)
    ('93.15%', '100.00%', 'n/a')
    """
    return MISSING if value is None else f"{value:.2%}"


def num(value: float | None, fmt: str = ".0f") -> str:
    """A number in the format spec `fmt` (whole numbers by default: images/s).

    >>> num(562.4), num(0.28541, ".4f"), num(None, ".4f")
    ('562', '0.2854', 'n/a')
    """
    return MISSING if value is None else format(value, fmt)
