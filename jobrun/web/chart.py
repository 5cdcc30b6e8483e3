"""The overview's throughput chart: attempts finished per minute, as inline SVG.

The chart is drawn on the server, as plain ``<rect>`` elements in the page's
markup, rather than by a charting library in the browser: the dashboard
ships one small script of its own and a Content-Security-Policy without
inline script (see :mod:`jobrun.web.security`), and the chart then refreshes
with the rest of the overview's live fragment for free.

:func:`throughput_chart` does the arithmetic only: stacked bars, jobs that
succeeded below and failed attempts above, scaled to the busiest minute of
the hour that :meth:`jobrun.postgres.web.DashboardReads.overview` reads by
the database clock. The template ``overview_live.html`` turns the
:class:`Chart` into SVG, one ``g.minute`` per minute with its counts as data
attributes the browser tests read.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from jobrun.postgres.web import Minute

CHART_WIDTH = 600
CHART_HEIGHT = 120


@dataclasses.dataclass(frozen=True, slots=True)
class Bar:
    """One minute's stacked bar, in the chart's coordinates (y grows downwards)."""

    minute: dt.datetime
    succeeded: int
    failed: int
    x: float
    succeeded_y: float
    succeeded_height: float
    failed_y: float
    failed_height: float


@dataclasses.dataclass(frozen=True, slots=True)
class Chart:
    """The bars and the size of the ``svg#throughput`` that holds them."""

    bars: tuple[Bar, ...]
    width: int
    height: int
    bar_width: float
    peak: int
    succeeded_total: int
    failed_total: int


def throughput_chart(minutes: Sequence[Minute]) -> Chart:
    """Stacked bars (succeeded below, failed above) scaled to the busiest minute."""
    peak = max((m.succeeded + m.failed for m in minutes), default=0)
    slot = CHART_WIDTH / max(len(minutes), 1)
    scale = (CHART_HEIGHT - 2) / peak if peak else 0.0
    bars = []
    for i, m in enumerate(minutes):
        ok_h = m.succeeded * scale
        bad_h = m.failed * scale
        bars.append(
            Bar(
                minute=m.minute,
                succeeded=m.succeeded,
                failed=m.failed,
                x=round(i * slot + 1, 2),
                succeeded_y=round(CHART_HEIGHT - ok_h, 2),
                succeeded_height=round(ok_h, 2),
                failed_y=round(CHART_HEIGHT - ok_h - bad_h, 2),
                failed_height=round(bad_h, 2),
            )
        )
    return Chart(
        bars=tuple(bars),
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        bar_width=round(max(slot - 2, 1), 2),
        peak=peak,
        succeeded_total=sum(m.succeeded for m in minutes),
        failed_total=sum(m.failed for m in minutes),
    )


__all__ = ["CHART_HEIGHT", "CHART_WIDTH", "Bar", "Chart", "throughput_chart"]
