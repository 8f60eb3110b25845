"""A colour-blind-safe palette and tiny SVG string builders shared by every view.

The views draw by concatenating strings; nothing here needs a browser, so a test can parse the
result with ``xml.etree``. The API is small and stable (other views build on it):

- ``PALETTE``: Okabe–Ito colours by name; ``ROLE``: the colour of each drawing role
  (``free, cached, shared, prefill, decode, waiting, preempted, finished, text, grid``).
- ``owner_color(i)``: the i-th colour of the cycle used for per-request (per-series) colours;
  ``text_color_on(fill)``: black or white, whichever reads on that fill.
- ``svg(width, height, body, title=None)``: a complete ``<svg>`` (xmlns, viewBox, font) that
  shrinks to its container: ``style="max-width:100%;height:auto"``.
- ``MAX_WIDTH``: the widest picture (px) a view should draw; a wider layout wraps or summarises.
- ``rect(x, y, w, h, fill, title=None, **attrs)``, ``text(x, y, s, size=11, anchor="start",
  **attrs)``, ``line(x1, y1, x2, y2, stroke=..., **attrs)``, ``polyline(points, stroke=...,
  **attrs)``, ``circle(cx, cy, r, fill, title=None, **attrs)``, ``group(body, **attrs)``,
  ``hatch(pattern_id, color)``: ``<defs>`` with a diagonal-hatch pattern for ``fill="url(#id)"``,
  ``legend(items, x, y)``: a one-row legend of (fill, label[, swatch_attrs]) items.

Keyword attributes are written with ``_`` turned into ``-`` and a trailing ``_`` dropped
(``stroke_width=2`` becomes ``stroke-width="2"``, ``class_="x"`` becomes ``class="x"``); a value
of ``None`` omits the attribute. Every text and attribute value is XML-escaped. A ``title``
becomes a ``<title>`` child, which browsers show as hover text. Coordinates are pixels (user
units of the viewBox), written with at most two decimals to keep the SVG small.
"""

from __future__ import annotations

from collections.abc import Iterable
from xml.sax.saxutils import escape, quoteattr

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision
# deficiencies.
PALETTE: dict[str, str] = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
}

# Colours by the role they play in a picture; the states of a request and of a KV block.
ROLE: dict[str, str] = {
    "free": "#F2F2F2",
    "cached": "#A6D5F2",  # a pale sky blue, drawn hatched so it never reads as an owner colour
    "shared": "#000000",  # an outline colour: shared blocks keep their owner's fill
    "prefill": PALETTE["orange"],
    "decode": PALETTE["blue"],
    "waiting": "#D9D9D9",
    "preempted": PALETTE["vermillion"],
    "finished": PALETTE["bluish_green"],
    "text": "#222222",
    "grid": "#9A9A9A",
    "background": "#FFFFFF",
}

# The per-owner cycle: the Okabe–Ito colours less black (kept for text and outlines).
OWNER_COLORS: tuple[str, ...] = (
    PALETTE["orange"], PALETTE["sky_blue"], PALETTE["bluish_green"], PALETTE["yellow"],
    PALETTE["blue"], PALETTE["vermillion"], PALETTE["reddish_purple"],
)

# The widest intrinsic width (px) of a view's picture: the batch timeline's 810. A page's text
# column is ~690 px on a laptop (Jupyter Book at 1280 px) and ~360 px on a phone; every picture
# shrinks to its column (svg() below), and a wider layout would shrink its 9-11 px text below
# legibility there, so views wrap or summarise rather than draw wider than this.
MAX_WIDTH = 820

# Pictures keep their width/height attributes (their size where there is room, and in viewers
# that drop styles) but never exceed their container; height:auto keeps the aspect ratio.
FIT_STYLE = "max-width:100%;height:auto"

FONT = "system-ui, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif"


def owner_color(index: int) -> str:
    """The colour of the index-th owner (request, series), cycling OWNER_COLORS."""
    return OWNER_COLORS[index % len(OWNER_COLORS)]


def text_color_on(fill: str) -> str:
    """Black or white, whichever reads better on the #RRGGBB colour fill."""
    if not (fill.startswith("#") and len(fill) == 7):
        return ROLE["text"]
    r, g, b = (int(fill[i:i + 2], 16) for i in (1, 3, 5))
    return ROLE["text"] if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "#FFFFFF"


def num(v: float) -> str:
    """A coordinate as short text: at most two decimals, no trailing zeros."""
    s = f"{float(v):.2f}".rstrip("0").rstrip(".")
    return "0" if s in ("-0", "") else s


def attrs_str(**attrs: object) -> str:
    """Keyword attributes as ' name="value"' pairs (see the module docstring for the rules)."""
    parts = []
    for key, value in attrs.items():
        if value is None:
            continue
        name = key.rstrip("_").replace("_", "-")
        text_value = num(value) if isinstance(value, float) else str(value)
        parts.append(f" {name}={quoteattr(text_value)}")
    return "".join(parts)


def title_el(title: str | None) -> str:
    """A <title> element (hover text), or nothing."""
    return "" if title is None else f"<title>{escape(title)}</title>"


def svg(width: float, height: float, body: str, title: str | None = None) -> str:
    """A complete, standalone <svg> of width × height pixels around body, that shrinks to fit
    a narrower container (its viewBox scales the drawing)."""
    head = attrs_str(xmlns="http://www.w3.org/2000/svg", width=num(width), height=num(height),
                     viewBox=f"0 0 {num(width)} {num(height)}", style=FIT_STYLE,
                     font_family=FONT, font_size="11", role="img")
    label = "" if title is None else title_el(title)
    return f"<svg{head}>{label}{body}</svg>"


def rect(x: float, y: float, w: float, h: float, fill: str, title: str | None = None,
         **attrs: object) -> str:
    """A rectangle; title becomes its hover text."""
    a = attrs_str(x=num(x), y=num(y), width=num(max(w, 0)), height=num(max(h, 0)), fill=fill,
                  **attrs)
    return f"<rect{a}>{title_el(title)}</rect>" if title else f"<rect{a}/>"


def text(x: float, y: float, s: object, size: float = 11, anchor: str = "start",
         **attrs: object) -> str:
    """Text with its baseline at y; anchor is start, middle or end."""
    attrs.setdefault("fill", ROLE["text"])
    a = attrs_str(x=num(x), y=num(y), font_size=num(size), text_anchor=anchor, **attrs)
    return f"<text{a}>{escape(str(s))}</text>"


def line(x1: float, y1: float, x2: float, y2: float, stroke: str = ROLE["grid"],
         **attrs: object) -> str:
    """A straight line segment."""
    a = attrs_str(x1=num(x1), y1=num(y1), x2=num(x2), y2=num(y2), stroke=stroke, **attrs)
    return f"<line{a}/>"


def polyline(points: Iterable[tuple[float, float]], stroke: str = ROLE["text"],
             fill: str = "none", **attrs: object) -> str:
    """An open path through points [(x, y), ...]."""
    pts = " ".join(f"{num(x)},{num(y)}" for x, y in points)
    return f"<polyline{attrs_str(points=pts, stroke=stroke, fill=fill, **attrs)}/>"


def circle(cx: float, cy: float, r: float, fill: str, title: str | None = None,
           **attrs: object) -> str:
    """A circle (a marker for a point); title becomes its hover text."""
    a = attrs_str(cx=num(cx), cy=num(cy), r=num(r), fill=fill, **attrs)
    return f"<circle{a}>{title_el(title)}</circle>" if title else f"<circle{a}/>"


def group(body: str, **attrs: object) -> str:
    """A <g> around body, e.g. group(s, transform="translate(10,0)")."""
    return f"<g{attrs_str(**attrs)}>{body}</g>"


def hatch(pattern_id: str, color: str, background: str = ROLE["background"]) -> str:
    """<defs> with a diagonal-hatch pattern; fill a shape with f"url(#{pattern_id})"."""
    body = (rect(0, 0, 6, 6, background)
            + line(0, 6, 6, 0, stroke=color, stroke_width=2)
            + line(-1, 1, 1, -1, stroke=color, stroke_width=2)
            + line(5, 7, 7, 5, stroke=color, stroke_width=2))
    pattern = (f"<pattern{attrs_str(id=pattern_id, width=6, height=6)}"
               f' patternUnits="userSpaceOnUse">{body}</pattern>')
    return f"<defs>{pattern}</defs>"


def legend(items: Iterable[tuple], x: float, y: float, swatch: float = 10,
           gap: float = 14) -> str:
    """A one-row legend from (x, y): items are (fill, label) or (fill, label, swatch_attrs)."""
    out, cx = [], x
    for fill, label, *extra in items:
        extra_attrs = {"stroke": ROLE["grid"], **(extra[0] if extra else {})}
        out.append(rect(cx, y - swatch + 1, swatch, swatch, fill, **extra_attrs))
        out.append(text(cx + swatch + 4, y, label))
        cx += swatch + 8 + 6.5 * len(label) + gap
    return "".join(out)
