"""BlockTableView: the paged KV pool at one engine step, replayed from a trace.

What a StepRecord tells, and so what the view can show: the physical blocks of each request
*scheduled in that step* (its block table), the number of free blocks after the step, and which
free blocks still hold a cached prefix. Blocks held by a running request that was not scheduled
in the step (e.g. when the token budget ran out) have no known owner; the view counts them as
"held, not scheduled" and draws the blocks it cannot place as free.

Preemption by swap (widgets.pressure): when the trace has swaps, a host pool panel lists the
requests whose K/V sit in host memory after the step (StepRecord.swapped) with their block
counts, and names the step's swap-outs and swap-ins; a preemption without swap is labelled
"recompute". Where the trace records waiting, the footer says how many wait and why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from minillm.trace import StepRecord
from widgets import svg as s
from widgets.base import TraceView, slider
from widgets.pressure import CAUSE_TEXT, has_swaps, host_panel_svg, records_waiting, swap_sizes

CELL = 26  # px per block in the grid (labelled with its id)
SMALL_CELL = 12  # px per block once the pool has more than 128 blocks (no labels)
TABLE_BLOCKS, TABLE_CELL = 14, 16  # blocks drawn of each block table (then "+N"), px each
TABLE_LABEL_W = 130  # px of a table row's colour, request id and phase before its blocks
TABLES_W = TABLE_LABEL_W + TABLE_BLOCKS * TABLE_CELL + 30  # 384 px: the "+N" fits after them
TABLES_GAP = 16  # px between the grid and the tables beside it: 16 x 26 + 16 + 384 = 816
NOTE_CHARS = 70  # characters of the step's preempted/finished note: 384 px of 10 px text
MAX_DRAWN_BLOCKS = 2048  # larger pools show their first blocks only
MAX_TABLE_ROWS = 16  # request block tables listed beside the grid
HATCH_ID = "minillm-cached-hatch"


def grid_shape(drawn: int) -> tuple[int, int]:
    """(px per block, blocks per row) for a grid of drawn blocks: 16 labelled 26 px cells a row
    up to 128 blocks, then 32 small cells a row (384 px: a 512-block pool is 16 rows), 64 a row
    past 1024 blocks (768 px: 2048 blocks are 32 rows), so no pool draws wider than a column."""
    if drawn <= 128:
        return CELL, min(drawn, 16)
    return SMALL_CELL, 32 if drawn <= 1024 else 64


def named(ids: Sequence[str], room: int) -> str:
    """Request ids as a list of at most room characters: the first ones and a count of the
    rest (a step that finishes dozens of requests keeps its note within the picture)."""
    shown: list[str] = []
    for rid in ids:
        left = len(ids) - len(shown) - 1
        text = ", ".join([*shown, rid]) + (f" and {left} more" if left else "")
        if shown and len(text) > room:
            break
        shown.append(rid)
    rest = len(ids) - len(shown)
    return ", ".join(shown) + (f" and {rest} more" if rest else "")


def request_colors(trace: Sequence[StepRecord]) -> dict[str, str]:
    """A stable colour per request id: the palette cycled in order of first appearance."""
    order: dict[str, str] = {}
    for rec in trace:
        for rid in [e.request_id for e in rec.scheduled] + rec.preempted + rec.finished:
            if rid not in order:
                order[rid] = s.owner_color(len(order))
    return order


def infer_block_size(trace: Sequence[StepRecord]) -> int:
    """The power-of-two block size for which every table holds ceil(tokens / size) blocks."""
    pairs = [(e.num_computed_tokens + e.num_tokens, len(rec.block_tables[e.request_id]))
             for rec in trace for e in rec.scheduled if e.request_id in rec.block_tables]
    sizes = [2**k for k in range(12)]
    fits = {b: sum(-(-tokens // b) == blocks for tokens, blocks in pairs) for b in sizes}
    best = max(sizes, key=lambda b: (fits[b], b == 16))
    return best if pairs else 16


def infer_num_blocks(trace: Sequence[StepRecord]) -> int:
    """The pool size a trace implies: the largest block id seen + 1, or the free blocks after a
    step + the blocks its unfinished requests hold (a lower bound where some were unscheduled)."""
    most = 0
    for rec in trace:
        held = {b for table in rec.block_tables.values() for b in table}
        live = {b for rid, t in rec.block_tables.items() if rid not in rec.finished for b in t}
        most = max(most, max(held | set(rec.cached_blocks), default=-1) + 1,
                   rec.num_free_blocks + len(live))
    return max(most, 1)


@dataclass(frozen=True)
class PoolSnapshot:
    """The pool during one step. owners: block id -> requests whose table holds it."""

    owners: dict[int, list[str]]
    cached: set[int]
    num_blocks: int
    num_free_after: int
    num_unplaced: int  # held after the step by requests not scheduled in it
    tokens: int  # tokens the scheduled requests hold (computed + this step's)
    slots: int  # block_size x blocks in their tables (shared blocks counted per table)

    @property
    def num_shared(self) -> int:
        return sum(len(o) > 1 for o in self.owners.values())

    def state(self, block: int) -> str:
        """'shared', 'owned', 'cached' or 'free' for one physical block id."""
        owners = self.owners.get(block, [])
        if owners:
            return "shared" if len(owners) > 1 else "owned"
        return "cached" if block in self.cached else "free"


def snapshot(rec: StepRecord, num_blocks: int, block_size: int) -> PoolSnapshot:
    """Who holds which block during rec, and the token vs slot occupancy of the tables."""
    owners: dict[int, list[str]] = {}
    for rid, table in rec.block_tables.items():
        for b in table:
            owners.setdefault(b, []).append(rid)
    live = {b for rid, t in rec.block_tables.items() if rid not in rec.finished for b in t}
    unplaced = max(num_blocks - rec.num_free_blocks - len(live), 0)
    tokens = sum(e.num_computed_tokens + e.num_tokens for e in rec.scheduled)
    slots = block_size * sum(len(t) for t in rec.block_tables.values())
    return PoolSnapshot(owners, set(rec.cached_blocks) - set(owners), num_blocks,
                        rec.num_free_blocks, unplaced, tokens, slots)


class BlockTableView(TraceView):
    """The physical KV blocks at trace[step] as a grid coloured by owner, with block tables.

    trace: StepRecords (llm.trace, or a simulator's). step: which record (default the last);
    num_blocks: the pool size (pass llm.config.num_kv_blocks; default inferred from the trace);
    block_size: tokens per block (default inferred from the tables). Free blocks are light
    grey, free blocks holding a cached prefix are hatched, shared blocks (ref count > 1) have
    a thick black outline and their ref count.
    """

    def __init__(self, trace: Sequence[StepRecord], step: int | None = None,
                 num_blocks: int | None = None, block_size: int | None = None):
        if not trace:
            raise ValueError("BlockTableView needs a trace with at least one step")
        self.trace = list(trace)
        self.num_blocks = num_blocks or infer_num_blocks(self.trace)
        self.block_size = block_size or infer_block_size(self.trace)
        self.colors = request_colors(self.trace)
        self.step = len(self.trace) - 1 if step is None else step
        self.swaps = has_swaps(self.trace)
        self.sizes = swap_sizes(self.trace, self.block_size) if self.swaps else {}
        self.waiting = records_waiting(self.trace)

    def controls(self) -> list[dict]:
        return [slider("step", 0, len(self.trace) - 1, play=True)]

    def snapshot(self) -> PoolSnapshot:
        """The pool at the selected step."""
        return snapshot(self.trace[self.step], self.num_blocks, self.block_size)

    def to_svg(self) -> str:
        rec, snap = self.trace[self.step], self.snapshot()
        drawn = min(self.num_blocks, MAX_DRAWN_BLOCKS)
        cell, cols = grid_shape(drawn)
        grid_w, grid_h = cols * cell, -(-drawn // cols) * cell
        # The tables go right of a labelled grid (<= 128 blocks: 800 px in all); under a pool
        # of small cells, so the picture stays ~620 px wide and its 9-10 px text is read at full
        # size in a laptop's ~690 px column (beside, a 512-block pool would be 768 px).
        beside = cell == CELL and grid_w + TABLES_GAP + TABLES_W <= s.MAX_WIDTH
        tx, ty = (grid_w + TABLES_GAP, 40) if beside else (0, 30 + grid_h + 24)
        tables = self._tables_svg(rec, snap, x=tx, y=ty)
        rows = min(len(rec.block_tables), MAX_TABLE_ROWS) + 2
        if self.swaps:  # the host pool under the tables
            host, host_h = host_panel_svg(rec, self.sizes, self.step, self.colors,
                                          x=tx, y=ty + rows * 18 + 18)
            tables += host
            rows += 1 + int(-(-host_h // 18))
        body_h = max(grid_h, rows * 18) if beside else ty - 40 + rows * 18
        width = max(grid_w + TABLES_GAP + TABLES_W if beside else max(grid_w, TABLES_W), 620)
        height = 40 + body_h + 70 + 16 * self.waiting
        title = f"KV blocks at step {rec.step} ({self.step + 1} of {len(self.trace)})"
        if not any(r.block_tables for r in self.trace):
            title += " (this trace records no block tables)"
        body = (s.hatch(HATCH_ID, s.ROLE["grid"], s.ROLE["cached"])
                + s.text(0, 16, title, size=13, font_weight="bold")
                + self._grid_svg(snap, drawn, cols, cell, y=30) + tables
                + self._footer_svg(snap, y=40 + body_h + 16)
                + (self._waiting_svg(rec, y=40 + body_h + 68) if self.waiting else ""))
        return s.svg(width, height, body, title=title)

    def _fill(self, snap: PoolSnapshot, b: int) -> str:
        """A block's fill: its (first) owner's colour, the cached hatch, or the free grey."""
        owners = snap.owners.get(b)
        if owners:
            return self.colors.get(owners[0], s.ROLE["grid"])
        return f"url(#{HATCH_ID})" if b in snap.cached else s.ROLE["free"]

    def _block_cell(self, snap: PoolSnapshot, b: int, x: float, y: float, cell: float,
                    label: bool = True) -> str:
        state, owners = snap.state(b), snap.owners.get(b, [])
        fill = self._fill(snap, b)
        if state == "shared":
            hover = f"block {b}: shared by requests {', '.join(owners)} (ref count {len(owners)})"
        elif state == "owned":
            hover = f"block {b}: request {owners[0]}"
        else:
            hover = f"block {b}: free" + (", holds a cached prefix" if state == "cached" else "")
        stroke = ({"stroke": s.ROLE["shared"], "stroke_width": 2.5} if state == "shared"
                  else {"stroke": s.ROLE["background"], "stroke_width": 1})
        out = s.rect(x + 1, y + 1, cell - 2, cell - 2, fill, title=hover,
                     class_=f"block {state}", **stroke)
        if label and cell >= 20:
            tag = f"{b}×{len(owners)}" if state == "shared" else str(b)
            out += s.text(x + cell / 2, y + cell / 2 + 4, tag, size=9, anchor="middle",
                          pointer_events="none", fill=s.text_color_on(fill))
        return out

    def _grid_svg(self, snap: PoolSnapshot, drawn: int, cols: int, cell: float,
                  y: float) -> str:
        """The pool as rows of cols blocks; runs of free blocks in a row share one rect."""
        out, b = [], 0
        while b < drawn:
            x0, y0 = (b % cols) * cell, y + (b // cols) * cell
            end = b
            while (end + 1 < drawn and (end + 1) % cols and snap.state(b) == "free"
                   and snap.state(end + 1) == "free" and cell < CELL):
                end += 1
            if end == b:
                out.append(self._block_cell(snap, b, x0, y0, cell))
            else:
                out.append(s.rect(x0 + 1, y0 + 1, (end - b + 1) * cell - 2, cell - 2,
                                  s.ROLE["free"], title=f"blocks {b}–{end}: free",
                                  class_="block free"))
            b = end + 1
        if drawn < snap.num_blocks:
            out.append(s.text(0, y + (-(-drawn // cols)) * cell + 12,
                              f"showing blocks 0–{drawn - 1} of {snap.num_blocks}", size=10))
        return "".join(out)

    def _tables_svg(self, rec: StepRecord, snap: PoolSnapshot, x: float, y: float) -> str:
        entries = {e.request_id: e for e in rec.scheduled}
        out = [s.text(x, y, "block tables (logical → physical)", font_weight="bold")]
        for i, (rid, table) in enumerate(list(rec.block_tables.items())[:MAX_TABLE_ROWS]):
            ty = y + 18 * (i + 1)
            e = entries.get(rid)
            what = f"{e.phase} {e.num_tokens}" if e else ""
            done = " ✓" if rid in rec.finished else ""
            out.append(s.rect(x, ty - 10, 10, 10, self.colors.get(rid, s.ROLE["grid"])))
            out.append(s.text(x + 14, ty, f"req {rid}{done}", size=10))
            out.append(s.text(x + 74, ty, what, size=9, fill=s.ROLE["grid"]))
            out.append(self._table_row(snap, table, x + TABLE_LABEL_W, ty - 12))
        more = len(rec.block_tables) - MAX_TABLE_ROWS
        ny = y + 18 * (min(len(rec.block_tables), MAX_TABLE_ROWS) + 1)
        if more > 0:
            out.append(s.text(x, ny, f"… and {more} more requests", size=10))
        recomputed = [rid for rid in rec.preempted if rid not in rec.swapped_out]
        label = "preempted (recompute)" if self.swaps else "preempted"
        parts = [(label, recomputed), ("finished ✓", rec.finished)]
        parts = [(what, ids) for what, ids in parts if ids]
        room = NOTE_CHARS // max(len(parts), 1) - 3  # 3: the gap between two notes
        notes = [f"{what}: {named(ids, room - len(what) - 2)}" for what, ids in parts]
        out.append(s.text(x, ny + 16, "   ".join(notes), size=10,
                          fill=s.ROLE["preempted"] if recomputed else s.ROLE["text"]))
        return "".join(out)

    def _waiting_svg(self, rec: StepRecord, y: float) -> str:
        """Who waits after the step and what stopped admission (the trace's waiting_cause)."""
        why = (f" · admission stopped by: {CAUSE_TEXT[rec.waiting_cause]}"
               if rec.waiting_cause in CAUSE_TEXT else "")
        return s.text(0, y, f"waiting after step: {rec.num_waiting}{why}", size=10,
                      class_="waiting-cause")

    def _table_row(self, snap: PoolSnapshot, table: list[int], x: float, y: float) -> str:
        shown, w = table[:TABLE_BLOCKS], TABLE_CELL
        row = "".join(self._block_cell(snap, b, x + w * i, y, w, label=False)
                      + s.text(x + w * i + w / 2, y + 11, b, size=7, anchor="middle",
                               pointer_events="none",
                               fill=s.text_color_on(self._fill(snap, b)))
                      for i, b in enumerate(shown))
        if len(table) > len(shown):
            row += s.text(x + w * len(shown) + 4, y + 11, f"+{len(table) - len(shown)}", size=9)
        return row

    def _footer_svg(self, snap: PoolSnapshot, y: float) -> str:
        states = Counter(snap.state(b) for b in range(snap.num_blocks))
        used = states["owned"] + states["shared"]
        fill = f"{snap.tokens / snap.slots:.0%}" if snap.slots else "–"
        counts = (f"in use: {used} (shared {states['shared']}) · free after step: "
                  f"{snap.num_free_after} of {snap.num_blocks} (cached prefix {len(snap.cached)})"
                  + (f" · held, not scheduled: {snap.num_unplaced}" if snap.num_unplaced else ""))
        frag = (f"occupancy: {snap.tokens} tokens in {snap.slots} slots "
                f"({snap.slots // self.block_size if self.block_size else 0} blocks × "
                f"{self.block_size}) = {fill} full; {snap.slots - snap.tokens} slots empty "
                "(internal fragmentation)")
        items = [(s.ROLE["free"], "free"), (f"url(#{HATCH_ID})", "cached prefix (free)"),
                 (s.owner_color(0), "owned (colour = request)"),
                 (s.owner_color(1), "shared (ref count > 1)",
                  {"stroke": s.ROLE["shared"], "stroke_width": 2.5})]
        return (s.legend(items, 0, y) + s.text(0, y + 20, counts, size=10)
                + s.text(0, y + 36, frag, size=10))
