"""Amdahl's and Gustafson's laws, fitted to measured speedups and projected to larger world sizes.

Amdahl (strong scaling: the problem is fixed, N workers share it): a serial fraction s of the
one-worker time cannot be split, so

    S(N) = 1 / (s + (1 - s) / N)            at most 1/s, however many workers

Gustafson (weak scaling: each worker keeps its share, the problem grows with N): of the time
N workers take, a fraction s is serial, so N workers do the work of

    S(N) = N - s (N - 1)                    one worker would need that much longer

For DDP on GPUs "serial" is whatever does not shrink with more ranks: the all-reduce that is
not hidden behind the backward pass, the data pipeline's fixed costs, the launch overheads.

>>> fit = fit_amdahl({1: 1.0, 2: 1 / (0.1 + 0.9 / 2), 4: 1 / (0.1 + 0.9 / 4)})
>>> round(fit.serial_fraction, 9), fit.residual_rms < 1e-9
(0.1, True)
>>> round(fit.speedup(512), 2)   # close to the ceiling 1/s = 10
9.83
>>> round(fit_gustafson({1: 1.0, 2: 1.9, 4: 3.7}).serial_fraction, 9)
0.1
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

PROJECT_AT = (8, 64, 512)  # a DGX node, a few racks, a large cluster


def amdahl_speedup(serial_fraction: float, workers: float) -> float:
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / workers)


def gustafson_speedup(serial_fraction: float, workers: float) -> float:
    return workers - serial_fraction * (workers - 1.0)


LAWS = {"amdahl": amdahl_speedup, "gustafson": gustafson_speedup}


@dataclass(frozen=True)
class Fit:
    """A law with its serial fraction fitted to measured (workers -> speedup) points."""

    law: str  # "amdahl" or "gustafson"
    serial_fraction: float
    residual_rms: float  # root mean square of measured - fitted speedup over the points
    points: int

    def speedup(self, workers: float) -> float:
        return LAWS[self.law](self.serial_fraction, workers)

    def as_dict(self, project_at: tuple[int, ...] = PROJECT_AT) -> dict[str, Any]:
        """The JSON form: serial fraction, the fit's residual, and speedup and efficiency at `project_at`."""
        return {
            "law": self.law,
            "serial_fraction": self.serial_fraction,
            "residual_rms": self.residual_rms,
            "points": self.points,
            "projection": {str(n): {"speedup": self.speedup(n), "efficiency": self.speedup(n) / n} for n in project_at},
        }


def fit_amdahl(speedups: dict[int, float]) -> Fit:
    """Least squares on Amdahl's form: the s in [0, 1] that minimises sum (S_measured - S(N; s))^2.

    One parameter on a bounded interval: a grid of 1000 brackets the best s, a golden-section search
    refines it to 1e-12, with no solver library. Measured speedups above N (superlinear: caches)
    push s to 0, the bound."""
    squares = lambda s: _squares("amdahl", s, speedups)  # noqa: E731
    grid = min(range(1001), key=lambda i: squares(i / 1000))
    return _fit("amdahl", speedups, _golden_section(squares, max(0, grid - 1) / 1000, min(1000, grid + 1) / 1000))


def fit_gustafson(speedups: dict[int, float]) -> Fit:
    """Least squares on Gustafson's form, linear in s: s = sum (N-1)(N-S) / sum (N-1)^2, kept in [0, 1]."""
    weights = sum((n - 1) ** 2 for n in speedups)
    s = sum((n - 1) * (n - sp) for n, sp in speedups.items()) / weights if weights else 0.0
    return _fit("gustafson", speedups, min(1.0, max(0.0, s)))


def _fit(law: str, speedups: dict[int, float], s: float) -> Fit:
    if not speedups:
        raise ValueError("no measured speedups to fit")
    return Fit(law, s, (_squares(law, s, speedups) / len(speedups)) ** 0.5, len(speedups))


def _squares(law: str, s: float, speedups: dict[int, float]) -> float:
    return sum((sp - LAWS[law](s, n)) ** 2 for n, sp in speedups.items())


def _golden_section(
    f: Callable[[float], float], low: float = 0.0, high: float = 1.0, tolerance: float = 1e-12
) -> float:
    ratio = (5**0.5 - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    while b - a > tolerance:
        if f(c) <= f(d):
            b, d = d, c
            c = b - ratio * (b - a)
        else:
            a, c = c, d
            d = a + ratio * (b - a)
    best = (a + b) / 2
    return min((low, high, best), key=f)  # the bounds themselves, where the minimum sits on one
