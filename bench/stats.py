"""Figures (one per measured quantity), percentiles and targets."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any


def percentile(samples: Sequence[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of ``samples``, linear between closest ranks."""
    if not samples:
        raise ValueError("no samples")
    if not 0 <= p <= 100:
        raise ValueError("p must be between 0 and 100")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * p / 100
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal from issue 6, checked on a figure's median (and its ratio to the ceiling)."""

    text: str
    check: Callable[[float, float | None], bool]

    def verdict(self, median: float, ratio: float | None) -> str:
        try:
            return "PASS" if self.check(median, ratio) else "MISS"
        except TypeError:  # a ratio target without a ceiling in this run
            return "n/a"


def at_least(value: float, unit: str, *, ratio: float | None = None) -> Target:
    text = f">= {value:,.0f} {unit}"
    if ratio is not None:
        text += f" and >= {ratio:g}x ceiling"

        def check(m: float, r: float | None) -> bool:
            if r is None:
                raise TypeError("no ceiling")
            return m >= value and r >= ratio

        return Target(text, check)
    return Target(text, lambda m, r: m >= value)


def not_below(value: float, unit: str) -> Target:
    """``>= value`` printed as given (``>= 0.85 x``), for ratios."""
    return Target(f">= {value:g} {unit}", lambda m, r: m >= value)


def at_most(value: float, unit: str) -> Target:
    return Target(f"<= {value:g} {unit}", lambda m, r: m <= value)


def below(value: float, unit: str) -> Target:
    return Target(f"< {value:g} {unit}", lambda m, r: m < value)


def ratio_at_least(ratio: float) -> Target:
    def check(m: float, r: float | None) -> bool:
        if r is None:
            raise TypeError("no ceiling")
        return r >= ratio

    return Target(f">= {ratio:g}x ceiling", check)


@dataclasses.dataclass
class Figure:
    """One measured quantity: a value per run, summarised by median, min and max."""

    name: str
    unit: str
    values: list[float]
    parameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    target: Target | None = None
    throughput: bool = False
    """jobs/s or tx/s: printed as a ratio to the ceiling too."""
    ratio: float | None = None
    """median / ceiling median, set once the ceiling is known."""

    @property
    def median(self) -> float:
        return float(statistics.median(self.values))

    @property
    def min(self) -> float:
        return float(min(self.values))

    @property
    def max(self) -> float:
        return float(max(self.values))

    @property
    def verdict(self) -> str | None:
        if self.target is None:
            return None
        return self.target.verdict(self.median, self.ratio)

    def record(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "unit": self.unit,
            "median": self.median,
            "min": self.min,
            "max": self.max,
            "runs": len(self.values),
            "values": list(self.values),
            "parameters": self.parameters,
            "ratio_to_ceiling": self.ratio,
            "target": self.target.text if self.target else None,
            "verdict": self.verdict,
        }
