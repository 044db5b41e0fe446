"""The overview's chart of dead letters created per hour, drawn as SVG bars by the template.

The bars are computed here and drawn by ``overview.html`` as plain SVG: no script, so the
page keeps its Content-Security-Policy. Each bar links to the dead-letter list filtered to
its hour.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from replayable.web.filters import filter_time
from replayable.web.models import HourCount, LettersPerHour

CHART_HOURS = 48
CHART_BAR_W, CHART_H = 20, 120  # SVG user units: 48 bars of 20 make 960 wide


@dataclasses.dataclass(frozen=True)
class Bar:
    """One hour's bar: where it stands, how tall it is, and the hour it links to."""

    x: int
    y: float
    height: float
    hour: HourCount
    since: str  # the hour's bounds, as the dead-letter filters take them
    until: str


def chart_bars(data: LettersPerHour) -> list[Bar]:
    """One bar per hour, scaled to the peak; an empty hour gets a 1-unit stub."""
    bars = []
    for i, hour in enumerate(data.per_hour):
        height = max(CHART_H * hour.created / data.peak, 2.0) if hour.created else 1.0
        bars.append(
            Bar(
                x=i * CHART_BAR_W,
                y=CHART_H - height,
                height=height,
                hour=hour,
                since=filter_time(hour.hour),
                until=filter_time(hour.hour + timedelta(hours=1)),
            )
        )
    return bars


def hour_label(moment: datetime) -> str:
    """An axis label: the hour in UTC, or the date at midnight."""
    utc = moment.astimezone(UTC)
    return utc.strftime("%b %d") if utc.hour == 0 else utc.strftime("%H:00")
