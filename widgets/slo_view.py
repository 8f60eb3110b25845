"""SLOView: move the SLO, and watch goodput and the knee move over a stored rate sweep.

A sweep keeps, per offered rate, each finished request's TTFT and TPOT and the run's duration,
so goodput under any SLO is a count: requests with TTFT <= the TTFT bound and TPOT <= the TPOT
bound, per second of the run (minillm.metrics.meets_slo's rule: a value equal to its bound
meets it; a one-token reply has no TPOT and meets any TPOT bound). The picture draws goodput
and throughput against the offered rate (log axis) and marks the knee, the rate of peak goodput
(the lowest on ties, as minillm.bench.rate_sweep.SweepResult.knee). Nothing is re-simulated: the
view only recounts what the sweep stored, so the page without a kernel replays it exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from . import offline
from .base import View, dropdown, slider
from .roofline import PositiveInt
from .svg import PALETTE, ROLE, circle, line, polyline, rect, svg, text

WIDTH, HEIGHT = 640, 340
LEFT, RIGHT, TOP, BOTTOM = 64, 20, 52, 86  # plot margins, pixels
TTFT_STOPS_MS = [50, 100, 200, 300, 500, 1000, 2000, 5000]  # the offline page's slider stops
TPOT_STOPS_MS = [10, 20, 30, 50, 100]
COLORS = {"goodput": PALETTE["blue"], "throughput": ROLE["grid"], "knee": PALETTE["vermillion"]}


@dataclass(frozen=True)
class SweepPoint:
    """One run of a sweep: the offered rate (requests/s), the run's duration (s) and each
    finished request's TTFT and TPOT (s; TPOT None for a one-token reply)."""

    rate: float
    duration: float
    ttft: tuple[float, ...]
    tpot: tuple[float | None, ...]

    def __post_init__(self) -> None:
        if len(self.ttft) != len(self.tpot) or not self.ttft:
            raise ValueError("a sweep point needs one TTFT and one TPOT per finished request, "
                             f"got {len(self.ttft)} and {len(self.tpot)}")
        if not (self.rate > 0 and self.duration > 0):
            raise ValueError(f"rate and duration must be positive, got {self.rate!r}, "
                             f"{self.duration!r}")

    @classmethod
    def of(cls, rate: float, metrics: Iterable, duration: float) -> SweepPoint:
        """From RequestMetrics (a simulation's outputs' or a benchmark's records'); only the
        finished requests count."""
        done = [m for m in metrics if m.finished_time is not None and m.ttft is not None]
        return cls(rate, duration, tuple(m.ttft for m in done), tuple(m.tpot for m in done))

    @property
    def throughput(self) -> float:
        """Finished requests per second."""
        return len(self.ttft) / self.duration

    def goodput(self, ttft: float, tpot: float) -> float:
        """Requests/s with TTFT <= ttft and TPOT <= tpot (seconds)."""
        good = sum(a <= ttft and (b is None or b <= tpot) for a, b in zip(self.ttft, self.tpot))
        return good / self.duration


def knee(points: Sequence[SweepPoint], ttft: float, tpot: float) -> tuple[float, float]:
    """(rate, goodput) of the rate with the most goodput under the SLO, the lowest on ties."""
    ordered = sorted(points, key=lambda p: p.rate)
    goodputs = [p.goodput(ttft, tpot) for p in ordered]
    best = max(goodputs)
    return next((p.rate, g) for p, g in zip(ordered, goodputs) if g == best)


def _fmt_rate(r: float) -> str:
    return f"{r:.3g}" if r < 1000 else f"{r:,.0f}"


class SLOView(View):
    """Goodput and the knee of stored sweeps under an SLO the reader moves.

    sweeps: {workload name: [SweepPoint, ...]} (one sweep per workload, each over its own
    rates); ttft_ms, tpot_ms: the SLO's bounds in milliseconds; source: what produced the
    sweeps, shown in the title (say "modelled" or "measured").

        SLOView({"128 in / 128 out": points}, ttft_ms=500, tpot_ms=50)   # shows itself
        SLOView(sweeps).widget()                                          # with sliders
    """

    ttft_ms = PositiveInt()
    tpot_ms = PositiveInt()

    def __init__(self, sweeps: dict[str, Sequence[SweepPoint]], ttft_ms: int = 1000,
                 tpot_ms: int = 50, workload: str | None = None, source: str = ""):
        if not sweeps or any(len(points) < 2 for points in sweeps.values()):
            raise ValueError("SLOView needs at least one sweep of at least two rates")
        self.sweeps = {name: sorted(points, key=lambda p: p.rate)
                       for name, points in sweeps.items()}
        self.source = source
        self.workload = workload or next(iter(self.sweeps))
        self.ttft_ms, self.tpot_ms = ttft_ms, tpot_ms

    @property
    def workload(self) -> str:
        """The name of the sweep shown (one of the sweeps' keys)."""
        return self._workload

    @workload.setter
    def workload(self, value: str) -> None:
        if value not in self.sweeps:
            raise ValueError(f"unknown workload {value!r}; choose from {', '.join(self.sweeps)}")
        self._workload = value

    @property
    def points(self) -> list[SweepPoint]:
        return self.sweeps[self.workload]

    def knee(self) -> tuple[float, float]:
        """(rate, goodput) at the knee under the current SLO (requests/s)."""
        return knee(self.points, self.ttft_ms / 1e3, self.tpot_ms / 1e3)

    def controls(self) -> list[dict]:
        return [dropdown("workload", list(self.sweeps)),
                slider("ttft_ms", 10, 10000, step=10, label="TTFT SLO (ms)"),
                slider("tpot_ms", 5, 500, step=5, label="TPOT SLO (ms)")]

    def offline_controls(self) -> list[tuple[dict, list]]:
        """Without a kernel: every workload (up to 4), the TTFT bound at 8 stops from 50 ms to
        5 s and the TPOT bound at 5 from 10 to 100 ms, the current values among them."""
        workload, ttft, tpot = self.controls()
        axes = [(ttft, offline.with_value(TTFT_STOPS_MS, self.ttft_ms)),
                (tpot, offline.with_value(TPOT_STOPS_MS, self.tpot_ms))]
        return ([(workload, list(self.sweeps))] if len(self.sweeps) <= 4 else []) + axes

    def to_svg(self) -> str:
        """Goodput and throughput against the offered rate, the knee marked, under the SLO."""
        points, t, p = self.points, self.ttft_ms / 1e3, self.tpot_ms / 1e3
        rates = [pt.rate for pt in points]
        x_lo, x_hi = math.log(min(rates)), math.log(max(rates))
        y_hi = max(pt.throughput for pt in points) * 1.15
        right, bottom = WIDTH - RIGHT, HEIGHT - BOTTOM

        def x(rate: float) -> float:
            return LEFT + (math.log(rate) - x_lo) / (x_hi - x_lo) * (right - LEFT)

        def y(v: float) -> float:
            return bottom - v / y_hi * (bottom - TOP)

        title = (f"{self.workload}: goodput under TTFT ≤ {self.ttft_ms:,} ms, "
                 f"TPOT ≤ {self.tpot_ms} ms")
        body = [rect(0, 0, WIDTH, HEIGHT, ROLE["background"]),
                text(LEFT, 20, title, size=13, font_weight="bold")]
        if self.source:
            body.append(text(LEFT, 38, self.source, fill=ROLE["grid"]))
        for k in range(5):  # the y grid: fifths of the axis
            v = y_hi * k / 5
            body += [line(LEFT, y(v), right, y(v), stroke="#E8E8E8"),
                     text(LEFT - 6, y(v) + 4, _fmt_rate(v), anchor="end")]
        for r in rates:
            body.append(text(x(r), bottom + 14, _fmt_rate(r), anchor="middle"))
        body += [rect(LEFT, TOP, right - LEFT, bottom - TOP, "none", stroke=ROLE["grid"]),
                 text((LEFT + right) / 2, bottom + 32, "offered rate (requests/s, log scale)",
                      anchor="middle"),
                 text(16, (TOP + bottom) / 2, "requests/s", anchor="middle",
                      transform=f"rotate(-90 16 {(TOP + bottom) / 2:.0f})")]
        body.append(polyline([(x(pt.rate), y(pt.throughput)) for pt in points],
                             stroke=COLORS["throughput"], stroke_width=2,
                             stroke_dasharray="5 3"))
        goodput = [(pt.rate, pt.goodput(t, p)) for pt in points]
        body.append(polyline([(x(r), y(g)) for r, g in goodput], stroke=COLORS["goodput"],
                             stroke_width=2.5))
        for r, g in goodput:
            body.append(circle(x(r), y(g), 3.5, COLORS["goodput"],
                               title=f"{_fmt_rate(r)} req/s offered: goodput {g:.3g} req/s"))
        body.append(self._knee_mark(x, y, bottom))
        body += [text(LEFT, HEIGHT - 30, "— goodput (meets the SLO)", fill=COLORS["goodput"]),
                 text(LEFT + 200, HEIGHT - 30, "- - throughput (finished)", fill=ROLE["text"])]
        return svg(WIDTH, HEIGHT, "".join(body), title=title)

    def _knee_mark(self, x, y, bottom: float) -> str:
        rate, good = self.knee()
        if good == 0:
            return text(LEFT, HEIGHT - 12, "no rate of the sweep meets this SLO: goodput 0",
                        fill=COLORS["knee"], font_weight="bold")
        share = good / next(pt.throughput for pt in self.points if pt.rate == rate)
        return "".join([
            line(x(rate), TOP, x(rate), bottom, stroke=COLORS["knee"], stroke_width=1.5,
                 stroke_dasharray="4 3"),
            circle(x(rate), y(good), 5, COLORS["knee"]),
            text(LEFT, HEIGHT - 12, f"knee: {_fmt_rate(rate)} req/s offered, goodput "
                 f"{good:.3g} req/s ({share:.0%} of the finished requests meet the SLO)",
                 fill=COLORS["knee"], font_weight="bold")])
