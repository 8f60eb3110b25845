"""The tiled loop's schedule as TilingView draws it: each (query tile, key tile) pair with its
place in the grid, and the geometry and labels of a tile (its masked corner, its rows and keys).

The order is minillm.attention.online_softmax.tile_schedule's, flattened, so the view replays
the very loop tiled_attention runs rather than a drawing of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.attention.online_softmax import tile_schedule


@dataclass(frozen=True)
class TileVisit:
    """One (query tile, key tile) pair of the schedule: rows [i0, i1) against keys [j0, j1);
    row and col are the tile's place in the grid; diagonal: some key is in some row's future
    (the tile is masked); order: its index in the schedule (0 is computed first)."""

    order: int
    row: int
    col: int
    i0: int
    i1: int
    j0: int
    j1: int
    diagonal: bool


def tile_visits(T: int, S: int, causal: bool, block_m: int, block_n: int) -> list[TileVisit]:
    """tile_schedule flattened: every tile tiled_attention computes, in its order."""
    visits = []
    for (i0, i1), keys in tile_schedule(T, S, causal, block_m, block_n):
        for j0, j1, diagonal in keys:
            visits.append(TileVisit(len(visits), i0 // block_m, j0 // block_n, i0, i1, j0, j1,
                                    diagonal))
    return visits


def span(what: str, start: int, end: int) -> str:
    """'rows 64–127', or 'row 0' for a span of one."""
    return f"{what} {start}" if end - start == 1 else f"{what}s {start}–{end - 1}"


def clip_above_diagonal(corners: list[tuple[float, float]], offset: float
                        ) -> list[tuple[float, float]]:
    """The part of a polygon [(key, row), ...] where key - row >= offset: a causal tile's
    masked corner (key j is in row i's future when j > S - T + i). Sutherland–Hodgman against
    one half-plane."""
    inside = [c - r >= offset for c, r in corners]
    out = []
    for k, (a, b) in enumerate(zip(corners, corners[1:] + corners[:1])):
        a_in, b_in = inside[k], inside[(k + 1) % len(corners)]
        if a_in:
            out.append(a)
        if a_in != b_in:  # the edge crosses key - row = offset: add the crossing
            da, db = a[0] - a[1] - offset, b[0] - b[1] - offset
            t = da / (da - db)
            out.append((a[0] + t * (b[0] - a[0]), a[1] + t * (b[1] - a[1])))
    return out
