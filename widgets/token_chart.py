"""The token chart under BatchTimeline's grid: prefill and decode tokens per step, stacked, with
the token budget as a dashed line. A bar's hover text also names the blocks the column's steps
swapped out and in, so the token dip a swap causes and its size read together.

Drawn on the timeline's columns (``view.col``, ``view.col_x``, ``view.steps_of``); above 100
columns the bars become two filled areas, which keeps long traces' SVG small.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from widgets import svg as s

if TYPE_CHECKING:  # the timeline imports this module
    from widgets.timeline import BatchTimeline

MAX_BARS = 100  # hoverable bars up to this many columns, filled areas beyond


def column_tallies(view: BatchTimeline) -> dict[int, list[float]]:
    """Per column: [prefill tokens, decode tokens, steps, blocks swapped out, blocks in]."""
    cols: dict[int, list[float]] = {}
    for i, rec in enumerate(view.trace):
        tally = cols.setdefault(view.col(i), [0, 0, 0, 0, 0])
        tally[0] += sum(e.num_tokens for e in rec.scheduled if e.phase == "prefill")
        tally[1] += sum(e.num_tokens for e in rec.scheduled if e.phase == "decode")
        tally[2] += 1
        tally[3] += rec.swap_out_blocks
        tally[4] += rec.swap_in_blocks
    return cols


def bar_hover(steps: str, p: float, d: float, n: float, out: float, back: float) -> str:
    """A bar's hover text: mean tokens per step, and the blocks swapped if any."""
    hover = f"{steps}: {p / n:.0f} prefill + {d / n:.0f} decode tokens/step"
    if out or back:
        hover += f"; swapped {out:.0f} blocks out, {back:.0f} in"
    return hover


def budget_svg(view: BatchTimeline, x: float, y: float, w: float, h: float) -> str:
    """Stacked prefill/decode tokens per column (mean per step) and view.budget's line, in the
    box (x, y, w, h)."""
    cols = column_tallies(view)
    top = max([view.budget or 0] + [(t[0] + t[1]) / t[2] for t in cols.values()]) or 1
    scale = (h - 10) / top
    out = [s.text(x - 6, y + 10, "tokens", size=9, anchor="end"),
           s.line(x, y + h, x + w, y + h)]
    if len(cols) > MAX_BARS:  # areas, not hundreds of hoverable bars
        out.append(budget_areas(view, cols, y + h, scale))
    for c, (p, d, n, sout, sin) in cols.items() if len(cols) <= MAX_BARS else ():
        x0, x1 = view.col_x(c)
        hp, hd = p / n * scale, d / n * scale
        hover = bar_hover(view.steps_of(c), p, d, n, sout, sin)
        out.append(s.rect(x0, y + h - hp - hd, x1 - x0, hd, s.ROLE["decode"], title=hover))
        out.append(s.rect(x0, y + h - hp, x1 - x0, hp, s.ROLE["prefill"], title=hover))
    if view.budget:
        by = y + h - view.budget * scale
        out.append(s.line(x, by, x + w, by, stroke=s.ROLE["text"], stroke_dasharray="4 3"))
        out.append(s.text(x + w, by - 3, f"budget {view.budget}", size=9, anchor="end"))
    return "".join(out)


def budget_areas(view: BatchTimeline, cols: dict[int, list[float]], base: float,
                 scale: float) -> str:
    """Prefill tokens and prefill + decode tokens per step as two stacked filled areas."""
    xs = [(view.col_x(c), t[0] / t[2] * scale, (t[0] + t[1]) / t[2] * scale)
          for c, t in sorted(cols.items())]
    out = ""
    for k, role in ((2, "decode"), (1, "prefill")):
        pts = [(xs[0][0][0], base)]
        pts += [pt for (x0, x1), *hs in xs for pt in ((x0, base - hs[k - 1]),
                                                       (x1, base - hs[k - 1]))]
        pts.append((xs[-1][0][1], base))
        out += s.polyline(pts, stroke="none", fill=s.ROLE[role])
    return s.group(out, class_="budget-areas")
