"""BatchTimeline: which request did what in every engine step (continuous batching, drawn).

Rows are requests in order of first appearance, columns are steps (or, with x="time", the
steps' start..end on the trace's clock). A request is "waiting" from its arrival until it
finishes, whenever it is not scheduled: before its first prefill, after a preemption, or when
the token budget left it out. The trace records no arrival times: pass arrivals (request id ->
seconds on the trace's clock, e.g. {o.request_id: o.metrics.arrival_time for o in outputs},
from LLM.generate or a simulation's outputs); without them a request arrives in the first step
that names it. Under the
grid, each step's scheduled tokens (prefill and decode, stacked) against an optional budget line.

Memory pressure (widgets.pressure): a request preempted by swap is drawn apart from one
preempted for recompute: a swap-out cell, a pale span while its K/V sit in host memory (it
keeps its computed tokens), and a swap-in cell when they come back; a recomputed request just
waits and prefills again. Where the trace records waiting, a strip under the token chart shows
how many requests each step left waiting, coloured by what stopped admission (seats, blocks,
token budget, static batch), and a line under the axis sums up the marked step.

Big traces are aggregated so the SVG stays small: more than MAX_COLUMNS steps share columns and
more than MAX_ROWS requests share rows; an aggregated cell shows its most notable state
(preempted > finished > prefill > decode) and its hover text names the steps and requests.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from minillm.trace import StepRecord
from widgets import pressure as pr
from widgets import svg as s
from widgets.base import TraceView, dropdown, slider
from widgets.block_table import infer_block_size
from widgets.token_chart import budget_svg

MAX_COLUMNS = 400
MAX_ROWS = 60
PRIORITY = {"decode": 1, "prefill": 2, "swap-in": 3, "finished": 4, "swap-out": 5,
            "preempted": 6}
COLORS = {**s.ROLE, **pr.SWAP_ROLE}
LEFT, PLOT_W, BUDGET_H, WAIT_H = 70, 720, 64, 20


@dataclass
class Cell:
    """One drawn cell: the most notable state in it and the tokens scheduled there."""

    state: str
    tokens: int = 0
    requests: set[str] = field(default_factory=set)


def plural(n: int, noun: str) -> str:
    """'1 token', '2 tokens'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def cell_state(rid: str, rec: StepRecord, phase: str | None) -> str | None:
    """A request's state in one step, or None when it was not named in the step. A swap-out
    is a preemption that keeps the K/V (in host memory); "preempted" is one that recomputes."""
    if rid in rec.swapped_out:
        return "swap-out"
    if rid in rec.preempted:
        return "preempted"
    if rid in rec.finished:
        return "finished"
    return "swap-in" if rid in rec.swapped_in else phase


class BatchTimeline(TraceView):
    """Requests × steps of a trace, coloured by phase, with the per-step token use under it.

    trace: StepRecords (llm.trace or a simulator's); step: the step marked (default the last);
    budget: draw the token budget per step (e.g. llm.config.max_num_batched_tokens);
    x: "step" (one column per step) or "time" (columns placed at start..end seconds);
    arrivals: request id -> arrival time (seconds, the trace's clock) to draw waiting from.
    """

    def __init__(self, trace: Sequence[StepRecord], step: int | None = None,
                 budget: int | None = None, x: Literal["step", "time"] = "step",
                 arrivals: Mapping[str, float] | None = None):
        if not trace:
            raise ValueError("BatchTimeline needs a trace with at least one step")
        self.trace = list(trace)
        self.budget = budget
        self.x = x
        self.step = len(self.trace) - 1 if step is None else step
        self.requests = self._request_order()
        self.num_cols = min(len(self.trace), MAX_COLUMNS)
        self.num_rows = min(len(self.requests), MAX_ROWS)
        self.cells, self.spans = self._aggregate()
        self._add_arrivals(arrivals or {})
        self.swaps = pr.has_swaps(self.trace)
        self.sizes = pr.swap_sizes(self.trace, infer_block_size(self.trace)) if self.swaps else {}
        self.swapped = pr.swapped_runs(self.trace, self.col, self.row)
        self.waiting = pr.records_waiting(self.trace)

    @property
    def x(self) -> str:
        """The x axis: "step" or "time"."""
        return self._x

    @x.setter
    def x(self, value: str) -> None:
        if value not in ("step", "time"):
            raise ValueError(f"x must be 'step' or 'time', got {value!r}")
        self._x = value

    def controls(self) -> list[dict]:
        return [slider("step", 0, len(self.trace) - 1, play=True), dropdown("x", ["step", "time"])]

    def _request_order(self) -> list[str]:
        order: dict[str, None] = {}
        for rec in self.trace:
            for rid in [e.request_id for e in rec.scheduled] + rec.preempted + rec.finished:
                order.setdefault(rid, None)
        return list(order)

    def col(self, step_index: int) -> int:
        """The column that shows trace[step_index]."""
        return step_index * self.num_cols // len(self.trace)

    def row(self, rid: str) -> int:
        """The row that shows request rid."""
        return self.rank[rid] * self.num_rows // len(self.requests)

    def _aggregate(self) -> tuple[dict[tuple[int, int], Cell], dict[int, tuple[int, int]]]:
        """Cells by (row, col) and, per row, the span of columns its requests were alive."""
        self.rank = {rid: i for i, rid in enumerate(self.requests)}
        cells: dict[tuple[int, int], Cell] = {}
        spans: dict[int, tuple[int, int]] = {}
        for i, rec in enumerate(self.trace):
            c = self.col(i)
            phases = {e.request_id: (e.phase, e.num_tokens) for e in rec.scheduled}
            for rid in set(phases) | set(rec.preempted) | set(rec.finished):
                phase, tokens = phases.get(rid, (None, 0))
                state = cell_state(rid, rec, phase) or "decode"
                r = self.row(rid)
                cell = cells.setdefault((r, c), Cell(state))
                if PRIORITY[state] > PRIORITY[cell.state]:
                    cell.state = state
                cell.tokens += tokens
                cell.requests.add(rid)
                lo, hi = spans.get(r, (c, c))
                spans[r] = (min(lo, c), max(hi, c))
        return cells, spans

    def _add_arrivals(self, arrivals: Mapping[str, float]) -> None:
        """Start each row's waiting span at the step during which its request arrived."""
        ends = [rec.end for rec in self.trace]
        for rid, t in arrivals.items():
            if rid in self.rank:
                r = self.row(rid)
                c = self.col(min(bisect_right(ends, t), len(self.trace) - 1))
                lo, hi = self.spans.get(r, (c, c))
                self.spans[r] = (min(lo, c), hi)

    def col_x(self, c: int) -> tuple[float, float]:
        """The left and right x (px) of column c."""
        if self.x == "step":
            w = PLOT_W / self.num_cols
            return LEFT + c * w, LEFT + (c + 1) * w
        first = -(-c * len(self.trace) // self.num_cols)
        last = -(-(c + 1) * len(self.trace) // self.num_cols) - 1
        t0, t1 = self.trace[0].start, self.trace[-1].end
        scale = PLOT_W / max(t1 - t0, 1e-12)
        return (LEFT + (self.trace[first].start - t0) * scale,
                LEFT + (self.trace[last].end - t0) * scale)

    def steps_of(self, c: int) -> str:
        """The step numbers column c covers, as text."""
        first = -(-c * len(self.trace) // self.num_cols)
        last = -(-(c + 1) * len(self.trace) // self.num_cols) - 1
        a, b = self.trace[first].step, self.trace[last].step
        return f"step {a}" if a == b else f"steps {a}–{b}"

    def row_label(self, r: int) -> str:
        """The request(s) row r shows, as text."""
        members = [rid for rid in self.requests if self.row(rid) == r]
        if len(members) == 1:
            return f"req {members[0]}"
        return f"req {members[0]}–{members[-1]}" if members else ""

    def to_svg(self) -> str:
        rh = 14 if self.num_rows <= 30 else 8
        extra = pr.legend_items(self.trace)
        top = 34 + 16 * bool(extra)  # a second legend row for swaps and waiting causes
        grid_h = self.num_rows * rh
        chart_y = top + grid_h + 14
        axis_y = chart_y + BUDGET_H + (WAIT_H + 8) * self.waiting
        rec = self.trace[self.step]
        summary = pr.step_summary(rec, self.sizes, self.step)
        height = axis_y + 34 + 16 * bool(summary)
        body = (s.text(0, 14, "batch timeline", size=13, font_weight="bold")
                + s.legend([(s.ROLE[k], k) for k in ("waiting", "prefill", "decode")]
                           + [(s.ROLE["preempted"], "preempted (recompute)" if self.swaps
                               else "preempted"), (s.ROLE["finished"], "finished")], 130, 14)
                + (s.legend(extra, 130, 30) if extra else "")
                + self._grid_svg(rh, top) + budget_svg(self, LEFT, chart_y, PLOT_W, BUDGET_H)
                + (pr.waiting_strip_svg(self.trace, self.num_cols, self.col, self.col_x,
                                     self.steps_of, LEFT, chart_y + BUDGET_H + 8, WAIT_H)
                   if self.waiting else "")
                + self._axis_svg(axis_y) + self._marker_svg(top - 4, axis_y, summary))
        if summary:  # the marked step's swaps, host pool and waiting
            body += s.text(LEFT, axis_y + 46, f"step {rec.step}: {summary}", size=10,
                           class_="step-summary")
        return s.svg(LEFT + PLOT_W + 20, height, body,
                     title=f"batch timeline, step {rec.step} marked")

    def _grid_svg(self, rh: float, top: float) -> str:
        out = []
        for r in range(self.num_rows):
            y = top + r * rh
            label = self.row_label(r)
            out.append(s.text(LEFT - 6, y + rh - 3, label, size=min(rh - 2, 10), anchor="end"))
            if r in self.spans:
                x0, _ = self.col_x(self.spans[r][0])
                _, x1 = self.col_x(self.spans[r][1])
                out.append(s.rect(x0, y + 1, x1 - x0, rh - 2, s.ROLE["waiting"],
                                  title=f"{label}: waiting when not scheduled"))
            out.extend(self._swapped_spans(r, y, rh, label))
            out.extend(self._row_runs(r, y, rh, label))
        return "".join(out)

    def _swapped_spans(self, r: int, y: float, rh: float, label: str) -> list[str]:
        """Row r's stretches in the host pool: swapped out, its K/V kept, not waiting to prefill."""
        out = []
        for c0, c1, i in self.swapped.get(r, []):
            x0, x1 = self.col_x(c0)[0], self.col_x(c1)[1]
            members = [rid for rid in self.trace[i].swapped if self.row(rid) == r]
            blocks = pr.blocks_text(pr.blocks_of(self.sizes, members[0], i)) if len(members) == 1 \
                else ""
            steps = self.steps_of(c0) if c0 == c1 else f"{self.steps_of(c0)} to {self.steps_of(c1)}"
            out.append(s.rect(x0, y + 1, max(x1 - x0, 0.5), rh - 2, pr.SWAP_ROLE["swapped"],
                              title=f"{label}, {steps}: swapped out, K/V in host memory{blocks}",
                              class_="swapped"))
        return out

    def _row_runs(self, r: int, y: float, rh: float, label: str) -> list[str]:
        """Runs of equal cells in row r merged into one rect each (keeps the SVG small)."""
        out, c = [], 0
        while c < self.num_cols:
            cell = self.cells.get((r, c))
            if cell is None:
                c += 1
                continue
            end = c
            tokens = cell.tokens
            while (cell.state == "decode" and (nxt := self.cells.get((r, end + 1)))
                   and nxt.state == "decode"):
                end += 1
                tokens += nxt.tokens
            x0, x1 = self.col_x(c)[0], self.col_x(end)[1]
            steps = self.steps_of(c) if end == c else f"{self.steps_of(c)} to {self.steps_of(end)}"
            hover = f"{label}, {steps}: {cell.state}, {plural(tokens, 'token')}"
            out.append(s.rect(x0, y + 1, max(x1 - x0, 0.5), rh - 2, COLORS[cell.state],
                              title=hover, class_=f"cell {cell.state}"))
            tag = str(cell.tokens)
            if cell.state == "prefill" and x1 - x0 >= 6 * len(tag) + 4 and rh >= 12:
                out.append(s.text((x0 + x1) / 2, y + rh - 3.5, tag, size=9, anchor="middle",
                                  fill=s.text_color_on(s.ROLE["prefill"]),
                                  pointer_events="none"))
            c = end + 1
        return out

    def _axis_svg(self, y: float) -> str:
        """Five tick labels along x, in steps or seconds since the first step."""
        out, last_x = [], -1e9
        for k in range(5):
            i = k * (len(self.trace) - 1) // 4
            x0, x1 = self.col_x(self.col(i))
            if (x0 + x1) / 2 - last_x < 48:  # too close to the previous tick to read
                continue
            last_x = (x0 + x1) / 2
            if self.x == "step":
                label = str(self.trace[i].step)
            else:
                label = f"{self.trace[i].start - self.trace[0].start:.3g} s"
            out.append(s.text((x0 + x1) / 2, y + 14, label, size=9, anchor="middle"))
        name = "step" if self.x == "step" else "time since the first step"
        return "".join(out) + s.text(LEFT + PLOT_W / 2, y + 28, name, size=10, anchor="middle")

    def _marker_svg(self, y0: float, y1: float, summary: str) -> str:
        x0, x1 = self.col_x(self.col(self.step))
        xm = (x0 + x1) / 2
        rec = self.trace[self.step]
        head = f"step {rec.step}: {plural(rec.num_tokens, 'token')}"
        hover = s.title_el(f"{head}; {summary.replace(' · ', '; ')}" if summary else head)
        return s.group(hover + s.line(xm, y0, xm, y1, stroke=s.ROLE["text"], stroke_width=1.5,
                                      stroke_dasharray="3 2", class_="marker")
                       + s.text(xm, y0 - 1, head, size=9,
                                anchor="middle" if xm < LEFT + PLOT_W - 60 else "end"))
