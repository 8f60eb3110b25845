"""TilingView: the score matrix of one head as a grid of tiles, replayed in the order
tiled_attention computes them.

Naive attention writes all T x S scores of a head before it reads one of them back; the tiled
loop (minillm.attention.online_softmax.tiled_attention, the loop inside FlashAttention) holds
one block_m x block_n tile of them at a time and folds it into a running softmax. The order is
``tile_schedule``: for each query tile, its key tiles left to right. The view replays that very
schedule (it does not redraw its own; tile_visits.py flattens it), one tile a step:

- done tiles, the current one (just computed, outlined), tiles still to come;
- with causal attention, the diagonal tiles (computed, then the part where the key lies in the
  query's future is masked to -inf: hatched), and the tiles past the diagonal, never computed
  at all (grey, "skipped: in the future");
- on the side bars, the Q rows of the current query tile and the K, V tile it reads;
- under the picture, the bytes: the T x S scores naive attention materialises against the one
  tile the loop holds, and the K, V bytes read so far. Every query tile reads its key tiles
  again, so the loop reads K and V about T / block_m times over: the re-reads FlashAttention's
  IO analysis counts (Dao et al., 2022), and why a bigger tile (more on-chip memory) reads less.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import svg as s
from .base import View, dropdown, slider
from .kv_calculator import fmt_bytes
from .tile_visits import TileVisit, clip_above_diagonal, span, tile_visits

# Tiles a side at most: a cell stays >= 13 px, and the 60 pictures a page carries (widgets.offline)
# of up to 1,024 cells draw in about a second and pack within its budget.
MAX_SIDE = 32
GRID_X, GRID_Y = 44, 78  # the grid's top-left corner; the Q bar and the K, V bar sit beside it
GRID_MAX = 416  # the grid's largest side (px); a cell is at most CELL_MAX
CELL_MAX = 26
BAR = 12  # the side bars' thickness
WIDTH = 660
MASK_PATTERN = "minillm-tiling-mask"  # the same id in every picture, so inlined copies agree
COLORS = {"done": s.PALETTE["sky_blue"], "current": s.PALETTE["orange"],
          "pending": s.ROLE["background"], "skipped": s.ROLE["waiting"], "mask": "#444444"}
SKIPPED_LABEL = "skipped: in the future"


@dataclass(frozen=True)
class TilingNumbers:
    """What the caption states at one step (bytes unless named)."""

    done: int  # tiles computed so far
    total: int  # tiles the schedule computes
    grid: int  # tiles in the whole T x S matrix (total + the skipped)
    naive_scores: int  # the T x S scores naive attention materialises
    tile_scores: int  # the one tile the loop holds
    kv_read: int  # K and V bytes read by the tiles computed so far
    kv_size: int  # K and V themselves (S keys, read once)


def _positive(name: str, value: object, unit: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer ({unit}); got {value!r}")
    return value


class TilingView(View):
    """The (T, S) scores of one head as tiles, replayed in tiled_attention's order.

    step: how many tiles are computed (0 to the schedule's length; default half way); the
    step-th is the current one. head_dim and dtype_bytes size the caption's bytes (K, V and
    scores in dtype_bytes each). T <= S when causal: the T queries are the last T positions.

        TilingView(1024, 1024)                  # a 16 x 16 grid, 136 tiles computed
        TilingView(1024, 1024).widget()         # with a step slider (play) and causal on/off
    """

    def __init__(self, T: int, S: int, block_m: int = 64, block_n: int = 64, causal: bool = True,
                 head_dim: int = 64, dtype_bytes: int = 2, step: int | None = None):
        self.T, self.S = _positive("T", T, "queries"), _positive("S", S, "keys")
        self.block_m = _positive("block_m", block_m, "query rows per tile")
        self.block_n = _positive("block_n", block_n, "keys per tile")
        self.head_dim = _positive("head_dim", head_dim, "numbers per key")
        self.dtype_bytes = _positive("dtype_bytes", dtype_bytes, "bytes per number")
        self.rows, self.cols = -(-T // block_m), -(-S // block_n)
        if max(self.rows, self.cols) > MAX_SIDE:
            raise ValueError(f"T={T}, S={S} in {block_m} x {block_n} tiles make a {self.rows} x "
                             f"{self.cols} grid; at most {MAX_SIDE} tiles a side are drawn: use "
                             "larger blocks")
        self._step = 0
        self.causal = causal
        self.step = len(self.visits) // 2 if step is None else step

    @property
    def causal(self) -> bool:
        """Causal attention: a query sees only keys at or before its position."""
        return self._causal

    @causal.setter
    def causal(self, value: bool) -> None:
        if value and self.S < self.T:
            raise ValueError(f"causal attention needs S >= T (the T queries are the last T of the "
                             f"S positions); got T={self.T}, S={self.S}: raise S or causal=False")
        self._causal = bool(value)
        self.visits = tile_visits(self.T, self.S, self._causal, self.block_m, self.block_n)
        self.step = self._step  # the schedule's length changed: clamp to it

    @property
    def step(self) -> int:
        """Tiles computed so far (clamped to the schedule)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = min(max(int(value), 0), len(self.visits))

    def controls(self) -> list[dict]:
        return [slider("step", 0, len(self.visits), play=True, label="tiles computed"),
                dropdown("causal", {"causal": True, "non-causal": False})]

    def offline_controls(self) -> list[tuple[dict, list]]:
        """Without a kernel: the step slider only (causal changes the number of steps)."""
        return [axis for axis in super().offline_controls() if axis[0]["name"] == "step"]

    def numbers(self) -> TilingNumbers:
        """The caption's counts and bytes at the current step."""
        b, D = self.dtype_bytes, self.head_dim
        kv_read = sum(2 * (v.j1 - v.j0) * D * b for v in self.visits[:self.step])  # K and V
        return TilingNumbers(done=self.step, total=len(self.visits), grid=self.rows * self.cols,
                             naive_scores=self.T * self.S * b,
                             tile_scores=min(self.block_m, self.T) * min(self.block_n, self.S) * b,
                             kv_read=kv_read, kv_size=2 * self.S * D * b)

    # --- drawing -----------------------------------------------------------------------------

    def _scale(self) -> tuple[float, float]:
        """Pixels per query row and per key: a full tile (or the whole of a T or S shorter than
        one, such as a decode's single query) is a square cell."""
        cell = min(CELL_MAX, GRID_MAX / self.cols, GRID_MAX / self.rows)
        return cell / min(self.block_m, self.T), cell / min(self.block_n, self.S)

    def to_svg(self) -> str:
        sy, sx = self._scale()
        grid_w, grid_h = self.S * sx, self.T * sy
        legend_y = GRID_Y + max(grid_h, 26 * (5 if self.causal else 3)) + 22
        body = [s.hatch(MASK_PATTERN, COLORS["mask"], background="none"),
                s.text(0, 16, self._title(), size=13, font_weight="bold"),
                s.text(0, 34, self._status()),
                self._kv_bar(), self._q_bar(), self._grid(sx, sy),
                self._legend(GRID_X + max(grid_w, GRID_MAX) + 16)]
        body += [s.text(0, legend_y + 18 * i, line, **attrs)
                 for i, (line, attrs) in enumerate(self._caption())]
        return s.svg(WIDTH, legend_y + 18 * 3 + 4, "".join(body), title=self._title())

    def _title(self) -> str:
        mode = "causal" if self.causal else "non-causal"
        queries = "query" if self.T == 1 else "queries"
        return (f"One head, T = {self.T:,} {queries} × S = {self.S:,} keys in {self.block_m} × "
                f"{self.block_n} tiles ({mode})")

    def _status(self) -> str:
        n = len(self.visits)
        if self.step == 0:
            return f"0 of {n} tiles computed: play to replay tiled_attention's loop"
        v = self.visits[self.step - 1]
        return (f"tile {self.step} of {n}: query tile {v.row} ({span('row', v.i0, v.i1)}) × key "
                f"tile {v.col} ({span('key', v.j0, v.j1)})" + (", masked" if v.diagonal else ""))

    def _current(self) -> TileVisit | None:
        return self.visits[self.step - 1] if self.step else None

    def _kv_bar(self) -> str:
        """K, V along the top: the current query tile's key tiles read so far, and this one."""
        sx = self._scale()[1]
        cur, y = self._current(), GRID_Y - BAR - 6
        out = [s.text(GRID_X, y - 6, f"K, V: {self.S:,} keys in tiles of {self.block_n}",
                      size=10)]
        for col in range(self.cols):
            j0, j1 = col * self.block_n, min((col + 1) * self.block_n, self.S)
            state = "" if cur is None else (
                " current" if col == cur.col else " read" if col < cur.col else "")
            fill = {" current": COLORS["current"], " read": COLORS["done"]}.get(state,
                                                                             COLORS["pending"])
            out.append(s.rect(GRID_X + j0 * sx, y, (j1 - j0) * sx, BAR, fill,
                              title=f"K, V tile {col}: {span('key', j0, j1)}",
                              stroke=s.ROLE["grid"], class_="kv-tile" + state))
        return "".join(out)

    def _q_bar(self) -> str:
        """Q down the left: the current query tile's rows."""
        sy, cur = self._scale()[0], self._current()
        out = [s.text(6, GRID_Y + 10, "Q", size=11, font_weight="bold")]
        for row in range(self.rows):
            i0, i1 = row * self.block_m, min((row + 1) * self.block_m, self.T)
            now = cur is not None and cur.row == row
            out.append(s.rect(GRID_X - BAR - 6, GRID_Y + i0 * sy, BAR, (i1 - i0) * sy,
                              COLORS["current"] if now else COLORS["pending"],
                              title=f"Q tile {row}: {span('row', i0, i1)}", stroke=s.ROLE["grid"],
                              class_="q-tile current" if now else "q-tile"))
        return "".join(out)

    def _grid(self, sx: float, sy: float) -> str:
        """Every cell of the grid: a computed tile (done, current, pending), or skipped."""
        by_cell = {(v.row, v.col): v for v in self.visits}
        out, current = [], None
        for row in range(self.rows):
            for col in range(self.cols):
                v = by_cell.get((row, col))
                if v is None:
                    out.append(self._skipped(row, col, sx, sy))
                elif v.order == self.step - 1:
                    current = self._tile(v, sx, sy)  # drawn last, so its outline is on top
                else:
                    out.append(self._tile(v, sx, sy))
        out.append(current or "")
        return "".join(out) + self._skipped_label(sx, sy)

    def _cell(self, row: int, col: int) -> tuple[int, int, int, int]:
        """The rows and keys [i0, i1) x [j0, j1) of a grid cell."""
        return (row * self.block_m, min((row + 1) * self.block_m, self.T),
                col * self.block_n, min((col + 1) * self.block_n, self.S))

    def _skipped(self, row: int, col: int, sx: float, sy: float) -> str:
        i0, i1, j0, j1 = self._cell(row, col)
        return s.rect(GRID_X + j0 * sx, GRID_Y + i0 * sy, (j1 - j0) * sx, (i1 - i0) * sy,
                      COLORS["skipped"], stroke=s.ROLE["background"], class_="tile skipped",
                      data_tile=f"{row},{col}")

    def _tile(self, v: TileVisit, sx: float, sy: float) -> str:
        """A computed tile; its masked part hatched; the rest of its cell, when the schedule
        cut the tile short at the last row's position, grey (never computed)."""
        state = ("done current" if v.order == self.step - 1 else
                 "done" if v.order < self.step else "pending")
        x, y, w, h = GRID_X + v.j0 * sx, GRID_Y + v.i0 * sy, (v.j1 - v.j0) * sx, (v.i1 - v.i0) * sy
        kind = "tile " + state + (" diagonal" if v.diagonal else "")
        hover = (f"query tile {v.row} ({span('row', v.i0, v.i1)}) × key tile {v.col} "
                 f"({span('key', v.j0, v.j1)}): tile {v.order + 1} of {len(self.visits)} computed"
                 + ("; keys in a row's future masked to -inf" if v.diagonal else ""))
        outline = {"stroke": s.ROLE["text"], "stroke_width": 2} if state == "done current" else {
            "stroke": s.ROLE["grid"], "stroke_width": 0.5}
        out = [s.rect(x, y, w, h, COLORS[state.split()[-1]], title=hover, class_=kind,
                      data_tile=f"{v.row},{v.col}", data_order=v.order, **outline)]
        cell_end = GRID_X + self._cell(v.row, v.col)[3] * sx
        if x + w < cell_end - 0.01:
            out.append(s.rect(x + w, y, cell_end - x - w, h, COLORS["skipped"],
                              class_="skipped-part"))
        if v.diagonal:
            corners = clip_above_diagonal([(v.j0, v.i0), (v.j1, v.i0), (v.j1, v.i1),
                                           (v.j0, v.i1)], self.S - self.T + 1)
            out.append(s.polyline([(GRID_X + c * sx, GRID_Y + r * sy) for c, r in corners],
                                  stroke="none", fill=f"url(#{MASK_PATTERN})", class_="mask",
                                  pointer_events="none"))
        return "".join(out)

    def _skipped_label(self, sx: float, sy: float) -> str:
        """'skipped: in the future' across the skipped cells of the quarter-way row, if wide."""
        row = self.rows // 4
        computed = sum(v.row == row for v in self.visits)
        room = (self.cols - computed) * self.block_n * sx
        if computed == self.cols or room < 6.2 * len(SKIPPED_LABEL) + 12:
            return ""
        i0, i1, _, _ = self._cell(row, 0)
        return s.text(GRID_X + self.S * sx - 6, GRID_Y + (i0 + i1) / 2 * sy + 4, SKIPPED_LABEL,
                      anchor="end", size=10, class_="skipped-label")

    def _legend(self, x: float) -> str:
        """One swatch a row, right of the grid."""
        items = [(COLORS["done"], "computed"), (COLORS["current"], "the current tile"),
                 (COLORS["pending"], "still to compute")]
        if self.causal:
            items += [(f"url(#{MASK_PATTERN})", "masked: computed, then -inf"),
                      (COLORS["skipped"], SKIPPED_LABEL)]
        out = []
        for i, (fill, label) in enumerate(items):
            y = GRID_Y + 26 * i
            out.append(s.rect(x, y, 14, 14, fill, stroke=s.ROLE["grid"]))
            out.append(s.text(x + 20, y + 11, label, size=10))
        return "".join(out)

    def _caption(self) -> list[tuple[str, dict]]:
        n = self.numbers()
        skipped = (f"; {n.grid - n.total} of {n.grid} never computed (in the future)"
                   if self.causal else "")
        reads = (f" = {n.kv_read / n.kv_size:.1f}× their size ({fmt_bytes(n.kv_size)})"
                 if n.kv_read else f" (their size: {fmt_bytes(n.kv_size)})")
        why = ("each query tile reads its key tiles again" if self.rows > 1 else
               "one query tile: one pass over K, V")
        tile = f"{min(self.block_m, self.T)} × {min(self.block_n, self.S)}"
        return [
            (f"tiles computed: {n.done} of {n.total}{skipped}", {"font_weight": "bold"}),
            (f"naive attention writes T × S = {self.T * self.S:,} scores "
             f"({fmt_bytes(n.naive_scores)}); the tiled loop holds one {tile} tile at a time "
             f"({fmt_bytes(n.tile_scores)})", {}),
            (f"K, V read so far: {fmt_bytes(n.kv_read)}{reads}: {why}", {}),
        ]

