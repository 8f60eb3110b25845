"""RooflineExplorer: a log-log roofline with a model's prefill and decode steps placed on it.

x is arithmetic intensity (FLOPs per byte moved), y the attainable FLOP/s, min(peak FLOP/s,
bandwidth * intensity). The roof bends at the ridge point (peak / bandwidth). Prefill of a
P-token prompt sits near x ~ P (compute-bound for long prompts); a decode step of B sequences
sits near x ~ B (memory-bound until B reaches the ridge). The numbers come from
``minillm.roofline``; this module only draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cache

from minillm.calc import models
from minillm.calc.roofline import (
    HARDWARE,
    Hardware,
    StepCost,
    decode_step_time,
    get_hardware,
    measure_machine,
    prefill_time,
    ridge_point,
)

from . import offline
from .base import View, dropdown, slider
from .svg import PALETTE, ROLE, circle, group, line, polyline, rect, svg, text

THIS_MACHINE = "this machine"
WIDTH, HEIGHT = 640, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 20, 46, 96  # plot margins, pixels
HALO = {"stroke": "#FFFFFF", "stroke_width": 3, "paint_order": "stroke"}  # text legible on lines


@cache
def this_machine() -> Hardware:
    """This machine's measured peaks (roofline.measure_machine), measured once per process."""
    return measure_machine(seconds=1.0)


def resolve_hardware(name: str | Hardware) -> Hardware:
    """A HARDWARE entry by name, a Hardware as given, or "this machine" (measured lazily)."""
    if isinstance(name, str) and name.strip().lower() == THIS_MACHINE:
        return this_machine()
    return get_hardware(name)


@dataclass(frozen=True)
class RooflinePoints:
    """What the plot shows: the device, its ridge (FLOPs/byte) and the two steps' costs."""

    hardware: Hardware
    model: str
    ridge: float
    prefill: StepCost
    decode: StepCost
    batch: int
    prompt_len: int
    context_len: int


def roofline_points(hardware: str | Hardware, model: str, batch: int, prompt_len: int,
                    context_len: int, dtype_bytes: float = 2) -> RooflinePoints:
    """Cost of one prefill of prompt_len tokens and one decode step of `batch` sequences at
    context_len tokens, on the named hardware (seconds, FLOPs, bytes: see StepCost)."""
    hw = resolve_hardware(hardware)
    return RooflinePoints(
        hardware=hw, model=model, ridge=ridge_point(hw),
        prefill=prefill_time(model, hw, prompt_len, dtype_bytes=dtype_bytes),
        decode=decode_step_time(model, hw, batch, context_len, dtype_bytes=dtype_bytes),
        batch=batch, prompt_len=prompt_len, context_len=context_len)


def fmt_seconds(t: float) -> str:
    """Seconds as a short human unit: 4.80 ms, 310 µs, 1.25 s."""
    for scale, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


def fmt_si(v: float, unit: str = "") -> str:
    """A number with an SI prefix: fmt_si(1e4) is "10k", fmt_si(3.35e12, "B/s") "3.35 TB/s"."""
    sep = " " if unit else ""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= scale:
            return f"{v / scale:.3g}{sep}{prefix}{unit}"
    return f"{v:.3g}{sep}{unit}"


@dataclass(frozen=True)
class _Axes:
    """Log-log mapping from (FLOPs/byte, FLOP/s) to pixels; bounds are log10 of the range."""

    x_lo: float
    x_hi: float
    y_lo: float
    y_hi: float

    def x(self, v: float) -> float:
        frac = (math.log10(v) - self.x_lo) / (self.x_hi - self.x_lo)
        return LEFT + frac * (WIDTH - LEFT - RIGHT)

    def y(self, v: float) -> float:
        frac = (math.log10(v) - self.y_lo) / (self.y_hi - self.y_lo)
        return HEIGHT - BOTTOM - frac * (HEIGHT - TOP - BOTTOM)


def _axes(p: RooflinePoints) -> _Axes:
    """Ranges that hold both points and the ridge with some room, the peak near the top."""
    xs = [p.prefill.arithmetic_intensity, p.decode.arithmetic_intensity, p.ridge]
    x_lo = math.log10(min(xs) / 3)
    x_hi = max(math.log10(max(xs) * 4), x_lo + 2)
    y_hi = math.log10(p.hardware.flops * 4)
    y_lo = min(math.log10(p.hardware.bandwidth) + x_lo - 0.3, y_hi - 2)
    return _Axes(x_lo, x_hi, y_lo, y_hi)


def _decades(lo: float, hi: float) -> range:
    """The whole powers of ten inside [10**lo, 10**hi], as exponents."""
    return range(math.ceil(lo - 1e-9), math.floor(hi + 1e-9) + 1)


def _grid(ax: _Axes) -> str:
    """Decade grid lines and tick labels on both axes, with axis titles."""
    out = []
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    for k in _decades(ax.x_lo, ax.x_hi):
        x = ax.x(10.0**k)
        out.append(line(x, TOP, x, bottom, stroke="#E0E0E0"))
        out.append(text(x, bottom + 14, fmt_si(10.0**k), anchor="middle"))
    for k in _decades(ax.y_lo, ax.y_hi):
        y = ax.y(10.0**k)
        out.append(line(LEFT, y, right, y, stroke="#E0E0E0"))
        out.append(text(LEFT - 6, y + 4, fmt_si(10.0**k), anchor="end"))
    out.append(rect(LEFT, TOP, right - LEFT, bottom - TOP, "none", stroke=ROLE["grid"]))
    out.append(text((LEFT + right) / 2, bottom + 30, "arithmetic intensity (FLOPs / byte)",
                    anchor="middle"))
    out.append(text(16, (TOP + bottom) / 2, "attainable FLOP/s", anchor="middle",
                    transform=f"rotate(-90 16 {(TOP + bottom) / 2:.1f})"))
    return "".join(out)


def _roof(p: RooflinePoints, ax: _Axes) -> str:
    """The roof min(peak, bandwidth * x) and the ridge marker."""
    hw, lo, hi = p.hardware, 10.0**ax.x_lo, 10.0**ax.x_hi
    top = ax.y(hw.flops)
    pts = [(ax.x(lo), ax.y(hw.bandwidth * lo)), (ax.x(p.ridge), top), (ax.x(hi), top)]
    rx = ax.x(p.ridge)
    return (polyline(pts, stroke=ROLE["text"], stroke_width=2.5)
            + line(rx, top, rx, HEIGHT - BOTTOM, stroke=ROLE["grid"],
                   stroke_dasharray="4 3")
            + text(rx + 4, HEIGHT - BOTTOM - 6, f"ridge {p.ridge:,.0f} FLOPs/B")
            + text(LEFT + 6, top - 8, f"peak {fmt_si(hw.flops, 'FLOP/s')}", fill=ROLE["grid"])
            + text(rx - 6, HEIGHT - BOTTOM - 24, "← memory-bound", anchor="end", **HALO)
            + text(rx + 6, HEIGHT - BOTTOM - 24, "compute-bound →", **HALO)
            + text(ax.x(lo) + 40, ax.y(hw.bandwidth * lo * 10**0.2) + 18,
                   fmt_si(hw.bandwidth, "B/s"), fill=ROLE["grid"]))


def _point(cost: StepCost, ax: _Axes, color: str, label: str, dy: float) -> str:
    """One step on the roof: a marker at (intensity, achieved FLOP/s), labelled."""
    x, y = ax.x(cost.arithmetic_intensity), ax.y(cost.flops / cost.time)
    hover = (f"{label}: {cost.arithmetic_intensity:,.1f} FLOPs/B, {cost.bound}-bound, "
             f"{fmt_seconds(cost.time)}")
    anchor = "end" if x > (LEFT + WIDTH) / 2 else "start"
    tx = x - 9 if anchor == "end" else x + 9
    return (circle(x, y, 6, color, title=hover, stroke=ROLE["text"])
            + text(tx, y + dy, f"{label}: {cost.bound}-bound, {fmt_seconds(cost.time)}",
                   anchor=anchor, font_weight="bold", fill=color, **HALO))


def _caption(p: RooflinePoints) -> str:
    """Two lines under the plot: each step's bound and predicted time."""
    y = HEIGHT - 40
    pre, dec = p.prefill, p.decode
    return (text(LEFT, y, f"prefill, {p.prompt_len:,} tokens: {pre.arithmetic_intensity:,.0f} "
                          f"FLOPs/B, {pre.bound}-bound, {fmt_seconds(pre.time)} (TTFT)",
                 fill=PALETTE["vermillion"])
            + text(LEFT, y + 18, f"decode, batch {p.batch}, context {p.context_len:,}: "
                                 f"{dec.arithmetic_intensity:,.1f} FLOPs/B, {dec.bound}-bound, "
                                 f"{fmt_seconds(dec.time)} per step", fill=PALETTE["blue"]))


def roofline_svg(p: RooflinePoints) -> str:
    """The whole picture for one state, as a standalone <svg> string."""
    ax = _axes(p)
    body = (rect(0, 0, WIDTH, HEIGHT, ROLE["background"])
            + text(LEFT, 22, f"{p.model} on {p.hardware.name}: roofline (modelled)", size=14,
                   font_weight="bold")
            + group(_grid(ax), class_="grid") + _roof(p, ax)
            + _point(p.prefill, ax, PALETTE["vermillion"], "prefill", -10)
            + _point(p.decode, ax, PALETTE["blue"], "decode", 16)
            + _caption(p))
    return svg(WIDTH, HEIGHT, body, title=f"Roofline of {p.hardware.name} with {p.model}")


HARDWARE_OPTIONS: list[str] = [*HARDWARE, THIS_MACHINE]
DTYPE_OPTIONS: dict[str, int] = {"bf16 / fp16 (2 B)": 2, "fp8 / int8 (1 B)": 1, "fp32 (4 B)": 4}


class PositiveInt:
    """A validated attribute: a positive int (8.0 from a slider becomes 8; 0, -1, 2.5 raise)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj: object, owner: type | None = None) -> int:
        return getattr(obj, self.slot)

    def __set__(self, obj: object, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) \
                or value < 1:
            raise ValueError(f"{self.name} must be a positive int, got {value!r}")
        setattr(obj, self.slot, int(value))


class Choice:
    """A validated attribute: one of a list of names, matched case-insensitively and stored in
    its canonical spelling (so the widget's dropdown shows it)."""

    def __init__(self, options: list[str]):
        self.options = options

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, "_" + name

    def __get__(self, obj: object, owner: type | None = None) -> str:
        return getattr(obj, self.slot)

    def __set__(self, obj: object, value: str) -> None:
        for option in self.options:
            if isinstance(value, str) and option.lower() == value.strip().lower():
                setattr(obj, self.slot, option)
                return
        raise ValueError(f"unknown {self.name} {value!r}; choose from {', '.join(self.options)}")


class PositiveNumber(PositiveInt):
    """A validated attribute: a positive finite number (bytes per element: 1, 2, 4, 0.5)."""

    def __set__(self, obj: object, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 \
                or math.isinf(value):
            raise ValueError(f"{self.name} must be a positive number, got {value!r}")
        setattr(obj, self.slot, value)


class RooflineExplorer(View):
    """A log-log roofline of `hardware` (a roofline.HARDWARE name, or "this machine", measured
    on first use) with `model`'s prefill of prompt_len tokens and decode step of `batch`
    sequences at context_len tokens placed on it; dtype_bytes per weight and KV element.

        RooflineExplorer("H100-SXM", "llama-3-8b", batch=8)        # shows itself in a notebook
        RooflineExplorer().widget()                                 # with dropdowns and sliders
    """

    hardware = Choice(HARDWARE_OPTIONS)
    model = Choice(models.names())
    batch = PositiveInt()
    prompt_len = PositiveInt()
    context_len = PositiveInt()
    dtype_bytes = PositiveNumber()

    def __init__(self, hardware: str = "H100-SXM", model: str = "llama-3-8b", batch: int = 8,
                 prompt_len: int = 1024, context_len: int = 2048, dtype_bytes: float = 2):
        self.hardware, self.model, self.dtype_bytes = hardware, model, dtype_bytes
        self.batch, self.prompt_len, self.context_len = batch, prompt_len, context_len

    def points(self) -> RooflinePoints:
        """The costs for the current state (see roofline_points)."""
        return roofline_points(self.hardware, self.model, self.batch, self.prompt_len,
                               self.context_len, self.dtype_bytes)

    def to_svg(self) -> str:
        """The roofline with both steps, their bound and predicted time."""
        return roofline_svg(self.points())

    def controls(self) -> list[dict]:
        """Dropdowns for hardware, model and dtype; sliders for batch and the two lengths."""
        return [dropdown("hardware", HARDWARE_OPTIONS), dropdown("model", models.names()),
                slider("batch", 1, 1024, label="decode batch"),
                slider("prompt_len", 16, 32768, step=16, label="prompt tokens"),
                slider("context_len", 16, 32768, step=16, label="decode context"),
                dropdown("dtype_bytes", DTYPE_OPTIONS, label="dtype")]

    def offline_controls(self) -> list[tuple[dict, list]]:
        """Without a kernel: every datasheet GPU (this machine only if it is the one shown:
        its peaks are measured) and the decode batch at powers of two."""
        hardware, batch = self.controls()[0], self.controls()[2]
        gpus = [*HARDWARE] + ([THIS_MACHINE] if self.hardware == THIS_MACHINE else [])
        return [(hardware, gpus), (batch, offline.with_value([2 ** k for k in range(11)],
                                                             self.batch))]
