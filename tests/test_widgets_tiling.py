"""TilingView replays the tiles tiled_attention computes, in its order: the steps are the
schedule's (query tile, key tile) pairs, the picture at step k marks exactly k of them done,
the cells past the causal diagonal are exactly the skipped ones, and the caption's bytes are the
tiles'. No browser: the checks read the SVG's XML."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
import torch

pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")

from minillm.attention.online_softmax import (  # noqa: E402
    online_softmax_update,
    tile_schedule,
    tiled_attention,
)
from widgets import TilingView, ViewWidget, offline  # noqa: E402
from widgets.tiling import clip_above_diagonal  # noqa: E402

SVG = "{http://www.w3.org/2000/svg}"


def tiles(view: TilingView, state: str) -> list[ET.Element]:
    """The grid's rects whose class holds state (done, current, pending, skipped, diagonal)."""
    root = ET.fromstring(view.to_svg())
    return [e for e in root.iter(f"{SVG}rect")
            if "tile" in (e.get("class") or "").split() and state in e.get("class").split()]


def cell(e: ET.Element) -> tuple[int, int]:
    row, col = e.get("data-tile").split(",")
    return int(row), int(col)


def texts(view: TilingView) -> str:
    root = ET.fromstring(view.to_svg())
    return "\n".join(e.text or "" for e in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("causal, pairs", [(True, 136), (False, 256)])
def test_steps_are_the_pairs_the_schedule_visits(causal: bool, pairs: int) -> None:
    """A 16 x 16 grid: causal visits 16 * 17 / 2 = 136 tiles, non-causal all 256."""
    view = TilingView(1024, 1024, causal=causal)
    visited = sum(len(keys) for _, keys in tile_schedule(1024, 1024, causal, 64, 64))
    assert visited == len(view.visits) == pairs
    step = next(c for c in view.controls() if c["name"] == "step")
    assert (step["min"], step["max"], step["play"]) == (0, pairs, True)


@pytest.mark.parametrize("T, S, causal", [(200, 1000, True), (130, 130, True), (1, 300, False)])
def test_the_view_replays_what_tiled_attention_computes(T: int, S: int, causal: bool) -> None:
    """An update that records each score tile tiled_attention folds in: the tiles come in the
    view's order, of its sizes, and exactly the view's diagonal tiles hold masked (-inf) scores."""
    seen: list[tuple[int, int, bool]] = []

    def spy(m, l, acc, scores, v):  # noqa: E741 (the running sum's name in the papers)
        seen.append((*scores.shape[-2:], bool(torch.isinf(scores).any())))
        return online_softmax_update(m, l, acc, scores, v)

    q, k = torch.randn(1, T, 16), torch.randn(1, S, 16)
    tiled_attention(q, k, k, causal=causal, block_m=64, block_n=48, update=spy)
    view = TilingView(T, S, block_m=64, block_n=48, causal=causal)
    assert seen == [(v.i1 - v.i0, v.j1 - v.j0, v.diagonal) for v in view.visits]


@pytest.mark.parametrize("step", [0, 1, 17, 68, 135, 136])
def test_the_picture_at_step_k_marks_k_tiles_done(step: int) -> None:
    view = TilingView(1024, 1024, step=step)
    done = tiles(view, "done")
    assert len(done) == step
    assert sorted(int(e.get("data-order")) for e in done) == list(range(step))
    assert len(tiles(view, "pending")) == 136 - step
    current = tiles(view, "current")
    assert [int(e.get("data-order")) for e in current] == ([step - 1] if step else [])
    if step:  # the side bars read the current tile: its Q rows and its K, V tile
        v = view.visits[step - 1]
        root = ET.fromstring(view.to_svg())
        bars = {e.get("class"): e for e in root.iter(f"{SVG}rect")
                if (e.get("class") or "").split()[:1] in (["q-tile"], ["kv-tile"])
                and "current" in e.get("class")}
        assert set(bars) == {"q-tile current", "kv-tile current"}
        assert f"Q tile {v.row}:" in bars["q-tile current"].find(f"{SVG}title").text
        assert f"K, V tile {v.col}:" in bars["kv-tile current"].find(f"{SVG}title").text


@pytest.mark.parametrize("T, S, bm, bn", [(1024, 1024, 64, 64), (256, 1024, 64, 64),
                                          (200, 1000, 64, 48), (130, 130, 32, 64)])
def test_skipped_tiles_are_exactly_those_past_the_diagonal(T: int, S: int, bm: int,
                                                            bn: int) -> None:
    """A cell is skipped when its first key comes after the last position of its query tile's
    last row (S - T + i1 - 1): every key in it is in every row's future."""
    view = TilingView(T, S, block_m=bm, block_n=bn)
    rows, cols = -(-T // bm), -(-S // bn)
    future = {(r, c) for r in range(rows) for c in range(cols)
              if c * bn >= S - T + min((r + 1) * bm, T)}
    assert {cell(e) for e in tiles(view, "skipped")} == future
    computed = {cell(e) for e in tiles(view, "done") + tiles(view, "pending")}
    assert computed.isdisjoint(future) and len(computed | future) == rows * cols
    if T == S == 1024:
        assert len(future) == 120 and "skipped: in the future" in texts(view)
    assert tiles(TilingView(T, S, block_m=bm, block_n=bn, causal=False), "skipped") == []


def test_the_diagonal_tiles_are_hatched_where_keys_are_in_the_future() -> None:
    view = TilingView(1024, 1024)
    assert {cell(e) for e in tiles(view, "diagonal")} == {(r, r) for r in range(16)}
    masks = [e for e in ET.fromstring(view.to_svg()).iter(f"{SVG}polyline")
             if e.get("class") == "mask"]
    assert len(masks) == 16
    # A 64 x 64 diagonal tile: key j is in row i's future when j > i, the half-plane j - i >= 1
    # of the continuous square, a triangle of 63 * 63 / 2.
    corners = clip_above_diagonal([(0, 0), (64, 0), (64, 64), (0, 64)], 1)
    area = 0.5 * abs(sum(x0 * y1 - x1 * y0 for (x0, y0), (x1, y1)
                         in zip(corners, corners[1:] + corners[:1])))
    assert area == pytest.approx(63 * 63 / 2)


def test_the_caption_counts_tiles_and_bytes() -> None:
    """T = S = 1024, 64 x 64 tiles, D = 64, 2-byte numbers: naive writes 1,048,576 scores
    (2.1 MB), the loop holds one 8,192-byte tile; after all 136 tiles it has read 136 key tiles
    of K and V (2.23 MB), (16 + 1) / 2 = 8.5 times their 262 kB."""
    view = TilingView(1024, 1024, step=136)
    n = view.numbers()
    assert (n.done, n.total, n.grid) == (136, 136, 256)
    assert (n.naive_scores, n.tile_scores) == (1024 * 1024 * 2, 64 * 64 * 2)
    assert n.kv_read == 136 * 2 * 64 * 64 * 2 and n.kv_size == 2 * 1024 * 64 * 2
    assert n.kv_read / n.kv_size == 8.5
    shown = texts(view)
    assert "tiles computed: 136 of 136; 120 of 256 never computed" in shown
    assert "1,048,576 scores (2.1 MB)" in shown and "64 × 64 tile at a time (8.19 kB)" in shown
    assert "K, V read so far: 2.23 MB = 8.5× their size (262 kB)" in shown
    assert TilingView(1024, 1024, step=0).numbers().kv_read == 0


@pytest.mark.parametrize("kwargs, named", [
    ({"T": 0, "S": 64}, "T must be a positive integer .* got 0"),
    ({"T": 64, "S": -1}, "S must be a positive integer .* got -1"),
    ({"T": 64, "S": 64, "block_m": 0}, "block_m must .* got 0"),
    ({"T": 64, "S": 64, "block_n": -64}, "block_n must .* got -64"),
    ({"T": 64, "S": 64, "head_dim": 0}, "head_dim must .* got 0"),
    ({"T": 1024, "S": 512}, "S >= T .* T=1024, S=512"),
    ({"T": 4096, "S": 4096, "block_m": 16, "block_n": 16}, "256 x 256 grid"),
])
def test_bad_arguments_raise_naming_the_value(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        TilingView(**kwargs)


def test_steps_clamp_and_causal_changes_the_range() -> None:
    view = TilingView(1024, 1024, step=500)
    assert view.step == 136
    view.set_state({"causal": False})
    assert next(c for c in view.controls() if c["name"] == "step")["max"] == 256
    view.set_state({"step": 256})
    view.set_state({"causal": True})
    assert view.step == 136, "back to causal: the step clamps to the shorter schedule"
    longer_query = TilingView(1024, 512, causal=False)  # fine without a mask, not with one
    with pytest.raises(ValueError, match="S >= T"):
        longer_query.set_state({"causal": True})


def test_mimebundle_carries_offline_frames_within_budget() -> None:
    view = TilingView(1024, 1024)
    html = view._repr_mimebundle_()["text/html"]
    assert f'<div class="mv-picture">{view.to_svg()}</div>' in html
    assert html.startswith('<div class="minillm-view" data-view="TilingView">')
    data, packed = offline.payload(view)
    assert len(packed) <= offline.BUDGET
    assert [c["name"] for c in data["controls"]] == ["step"]
    steps = data["controls"][0]["values"]
    assert steps[0] == 0 and steps[-1] == 136 and view.step in steps
    assert len(steps) <= offline.MAX_STEPS + 1


def test_widget_moves_the_step() -> None:
    view = TilingView(1024, 1024)
    widget = view.widget()
    assert isinstance(widget, ViewWidget) and widget.svg == view.to_svg()
    assert {c["name"] for c in widget.controls} == set(view.get_state()) == {"step", "causal"}
    widget.values = {**widget.values, "step": 3}
    assert view.step == 3 and widget.svg == view.to_svg()
    assert len(tiles(view, "done")) == 3
