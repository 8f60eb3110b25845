"""KVCalculator: how much memory the KV cache takes, and how many sequences fit on one GPU.

    KV bytes = 2 (K and V) * L layers * H_kv heads * D head dim * S tokens * B sequences * bytes

The picture is one bar of the device's memory split into the weights, the KV cache of the B
sequences asked for, and what is left; the text under it substitutes the model's numbers into
the formula and gives the KV wall (sizing.max_concurrency). The KV cache may take its own dtype
(kv_dtype: an fp8 or int8 cache next to bf16 weights), which is what moves the wall. The numbers
come from ``minillm.sizing``; this module only lays them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.calc import models
from minillm.calc.roofline import HARDWARE
from minillm.calc.sizing import (
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_dtype_bytes,
    kv_dims,
    max_concurrency,
    weight_bytes,
)

from . import offline
from .base import View, dropdown, slider
from .roofline import DTYPE_OPTIONS, Choice, PositiveInt, PositiveNumber
from .svg import PALETTE, ROLE, hatch, legend, line, rect, svg, text

WIDTH, HEIGHT = 640, 236
OVER_PATTERN = "minillm-kv-over"  # the same id in every picture, so inlined copies agree
BAR_X, BAR_Y, BAR_W, BAR_H = 20, 62, 600, 44
SAME_AS_WEIGHTS = "same as weights"
# The KV dtype choices, each a sizing.KV_CACHE_DTYPE_BYTES name ("same as weights" is "auto").
KV_DTYPES = [SAME_AS_WEIGHTS, "bf16", "fp8", "int8"]
COLORS = {"weights": PALETTE["blue"], "kv": PALETTE["orange"], "free": ROLE["free"],
          "over": PALETTE["vermillion"]}


@dataclass(frozen=True)
class KVNumbers:
    """Every number the calculator shows (bytes unless named)."""

    model: str
    hardware: str
    layers: int
    kv_heads: int
    head_dim: int
    context_len: int
    batch: int
    dtype_bytes: float
    per_token: float
    total: float
    weights: float
    memory: float
    max_sequences: int
    kv_dtype: str = SAME_AS_WEIGHTS
    kv_dtype_bytes: float | None = None  # None: dtype_bytes (the weights')

    @property
    def free(self) -> float:
        """Memory left after the weights and the batch's KV cache (negative: does not fit)."""
        return self.memory - self.weights - self.total

    @property
    def kv_bytes(self) -> float:
        """Bytes per K or V number: kv_dtype_bytes, or the weights' dtype_bytes."""
        return self.dtype_bytes if self.kv_dtype_bytes is None else self.kv_dtype_bytes

    def kv_dtype_phrase(self) -> str:
        """The KV dtype next to the weights', as the picture names it."""
        if self.kv_dtype == SAME_AS_WEIGHTS:
            return f"KV dtype as the weights ({self.kv_bytes:g} B)"
        return f"{self.kv_dtype} KV ({self.kv_bytes:g} B; weights {self.dtype_bytes:g} B)"

    def formula(self) -> str:
        """The KV formula with this model's numbers substituted."""
        n = f"{self.kv_bytes:g}"
        return (f"2 · L · H_kv · D · S · B · bytes = 2 · {self.layers} · {self.kv_heads} · "
                f"{self.head_dim} · {self.context_len:,} · {self.batch} · {n} = "
                f"{self.total:,.0f} bytes ({fmt_bytes(self.total)})")


def kv_numbers(model: str, context_len: int, batch: int, dtype_bytes: float,
               hardware: str, kv_dtype: str = SAME_AS_WEIGHTS) -> KVNumbers:
    """The calculator's numbers for one state, all from minillm.calc.sizing. dtype_bytes: bytes per
    weight; kv_dtype: one of KV_DTYPES, the cache's dtype."""
    if kv_dtype not in KV_DTYPES:
        raise ValueError(f"unknown kv_dtype {kv_dtype!r}; choose from {', '.join(KV_DTYPES)}")
    kv_bytes = kv_cache_dtype_bytes("auto" if kv_dtype == SAME_AS_WEIGHTS else kv_dtype,
                                    dtype_bytes)
    layers, kv_heads, head_dim = kv_dims(model)
    return KVNumbers(
        model=model, hardware=hardware, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
        context_len=context_len, batch=batch, dtype_bytes=dtype_bytes,
        per_token=kv_bytes_per_token(model, kv_bytes),
        total=kv_cache_bytes(model, context_len, batch, kv_bytes),
        weights=weight_bytes(model, dtype_bytes), memory=HARDWARE[hardware].memory,
        max_sequences=max_concurrency(model, hardware, context_len, dtype_bytes=dtype_bytes,
                                      kv_dtype_bytes=kv_bytes),
        kv_dtype=kv_dtype, kv_dtype_bytes=None if kv_dtype == SAME_AS_WEIGHTS else kv_bytes)


def fmt_bytes(n: float) -> str:
    """Bytes in decimal units, as datasheets state memory: 1.07 GB, 128 kB."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def _bar(k: KVNumbers) -> str:
    """The memory bar: weights | KV of B sequences | free; past the end, the overflow."""
    scale = BAR_W / max(k.memory, k.weights + k.total)
    parts = [("weights", k.weights, f"weights {fmt_bytes(k.weights)}"),
             ("kv", k.total, f"KV for {k.batch} × {k.context_len:,} tokens: "
                             f"{fmt_bytes(k.total)}"),
             ("free", max(k.free, 0), f"free {fmt_bytes(max(k.free, 0))}")]
    out, x = [], BAR_X
    for kind, size, hover in parts:
        w = size * scale
        out.append(rect(x, BAR_Y, w, BAR_H, COLORS[kind], title=hover, class_=kind))
        if w > 60:
            fill = ROLE["text"] if kind == "free" else "#FFFFFF"
            out.append(text(x + 5, BAR_Y + BAR_H / 2 + 4, fmt_bytes(size), fill=fill))
        x += w
    mem_x = BAR_X + k.memory * scale
    out.append(rect(BAR_X, BAR_Y, k.memory * scale, BAR_H, "none", stroke=ROLE["text"]))
    if k.free < 0:  # hatch the part past the device's memory and mark where memory ends
        out.append(hatch(OVER_PATTERN, COLORS["over"]))
        out.append(rect(mem_x, BAR_Y, BAR_X + BAR_W - mem_x, BAR_H, f"url(#{OVER_PATTERN})",
                        opacity=0.8, title=f"over by {fmt_bytes(-k.free)}", class_="over"))
        out.append(line(mem_x, BAR_Y - 6, mem_x, BAR_Y + BAR_H + 6, stroke=COLORS["over"],
                        stroke_width=3))
        out.append(text(BAR_X + BAR_W, BAR_Y - 6, f"over by {fmt_bytes(-k.free)}", anchor="end",
                        fill=COLORS["over"], font_weight="bold"))
    return "".join(out)


def _lines(k: KVNumbers) -> list[tuple[str, dict]]:
    """The text under the bar, one (line, attributes) pair a line."""
    fits = (f"fits: {fmt_bytes(k.free)} left" if k.free >= 0 else
            f"does not fit: {fmt_bytes(-k.free)} over the device's memory")
    wall = (f"KV wall: at most {k.max_sequences:,} sequences of {k.context_len:,} tokens at once"
            if k.max_sequences else "the weights alone do not fit on this device")
    return [
        (f"KV per token, {k.kv_dtype_phrase()}: 2 · {k.layers} · {k.kv_heads} · {k.head_dim} · "
         f"{k.kv_bytes:g} = {k.per_token:,.0f} bytes ({fmt_bytes(k.per_token)})", {}),
        ("KV bytes = 2 · L · H_kv · D · S · B · bytes", {}),
        ("= " + k.formula().split(" = ", 1)[1], {"font_weight": "bold"}),
        (f"weights: {fmt_bytes(k.weights)} · batch {k.batch}: {fits}",
         {"fill": COLORS["over"]} if k.free < 0 else {}),
        (wall, {"font_weight": "bold"}),
    ]


def kv_svg(k: KVNumbers) -> str:
    """The whole picture for one state, as a standalone <svg> string."""
    kv_label = f"KV, {k.batch} seq" + ("" if k.kv_dtype == SAME_AS_WEIGHTS else f", {k.kv_dtype}")
    body = [rect(0, 0, WIDTH, HEIGHT, ROLE["background"]),
            text(BAR_X, 24, f"{k.model} KV cache on {k.hardware} ({fmt_bytes(k.memory)})",
                 size=14, font_weight="bold"),
            legend([(COLORS["weights"], "weights"), (COLORS["kv"], kv_label),
                    (COLORS["free"], "free")], BAR_X, 48),
            _bar(k)]
    for i, (s, attrs) in enumerate(_lines(k)):
        body.append(text(BAR_X, BAR_Y + BAR_H + 28 + 22 * i, s, size=12, **attrs))
    return svg(WIDTH, HEIGHT, "".join(body), title=f"KV cache of {k.model} on {k.hardware}")


class KVCalculator(View):
    """KV-cache bytes (total and per token), weight bytes, and the most sequences of
    context_len tokens that fit at once on `hardware` (a roofline.HARDWARE name), for `batch`
    sequences of `model` with dtype_bytes per weight and its KV cache in kv_dtype (one of
    KV_DTYPES: "same as weights", "bf16", "fp8", "int8").

        KVCalculator("llama-3-8b", context_len=8192, batch=16)      # shows itself in a notebook
        KVCalculator(kv_dtype="fp8")                                # bf16 weights, fp8 KV
        KVCalculator().widget()                                     # with dropdowns and sliders
    """

    model = Choice(models.names())
    context_len = PositiveInt()
    batch = PositiveInt()
    dtype_bytes = PositiveNumber()
    hardware = Choice(list(HARDWARE))
    kv_dtype = Choice(KV_DTYPES)

    def __init__(self, model: str = "llama-3-8b", context_len: int = 8192, batch: int = 1,
                 dtype_bytes: float = 2, hardware: str = "H100-SXM",
                 kv_dtype: str = SAME_AS_WEIGHTS):
        self.model, self.hardware, self.dtype_bytes = model, hardware, dtype_bytes
        self.context_len, self.batch, self.kv_dtype = context_len, batch, kv_dtype

    def numbers(self) -> KVNumbers:
        """The calculator's numbers for the current state (see kv_numbers)."""
        return kv_numbers(self.model, self.context_len, self.batch, self.dtype_bytes,
                          self.hardware, self.kv_dtype)

    def to_svg(self) -> str:
        """The memory bar and the formula with the numbers substituted."""
        return kv_svg(self.numbers())

    def controls(self) -> list[dict]:
        """Dropdowns for model, hardware, the weights' dtype and the KV's; sliders for context
        and batch."""
        return [dropdown("model", models.names()), dropdown("hardware", list(HARDWARE)),
                slider("context_len", 256, 131072, step=256, label="context tokens"),
                slider("batch", 1, 256, label="sequences"),
                dropdown("dtype_bytes", DTYPE_OPTIONS, label="weight dtype"),
                dropdown("kv_dtype", KV_DTYPES, label="KV dtype")]

    def offline_controls(self) -> list[tuple[dict, list]]:
        """Without a kernel: the context at powers of two from 1k to 128k, a few batch sizes
        and every KV dtype, for the model and GPU shown."""
        context, batch, kv = self.controls()[2], self.controls()[3], self.controls()[5]
        return [(context, offline.with_value([2 ** k for k in range(10, 18)], self.context_len)),
                (batch, offline.with_value([1, 8, 16, 32, 64, 128, 256], self.batch)),
                (kv, list(KV_DTYPES))]
