"""Every view's picture fits a text column: it scales (viewBox + max-width) and stays narrow.

A Jupyter Book page's text column is ~690 px wide at a 1280 px window and ~360 px on a phone
(tests/test_site_fit.py measures it in the built site). Each picture is an <svg> whose width
and height attributes give its natural size and whose viewBox and style
``max-width:100%;height:auto`` let it shrink, aspect kept, to a narrower column. Shrinking
scales its 9-11 px text too, so a picture must also not be drawn much wider than the column:
every view, small and large (a 512- and a 2048-block pool, a 1,000-step timeline with 100
requests, a prefix tree 7 levels deep and 40 branches wide), stays within svg.MAX_WIDTH =
820 px (the batch timeline's 810: at most a 0.84 shrink on a laptop), and draws nothing
outside its viewBox (which would be cut off). No browser: the checks read the SVG's XML.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable

import pytest

from minillm.trace import CacheNode, PrefixCacheSnapshot, ScheduledEntry, StepRecord
from widgets import (
    BatchTimeline,
    BlockTableView,
    KVCalculator,
    PrefixCacheView,
    RooflineExplorer,
    TilingView,
)
from widgets import svg as s
from widgets.base import View

NS = "{http://www.w3.org/2000/svg}"
# The advance of a character, in em, that a text has at least on average: in Chromium with
# DejaVu Sans the views' texts of over 30 characters measure 0.47-0.62 em a character (mean
# 0.52). With the low end, a text this test says runs out of its picture surely does;
# tests/test_site_fit.py measures the real boxes in the built site.
CHAR_EM = 0.45


def entry(rid: str, phase: str, num_tokens: int, computed: int) -> ScheduledEntry:
    return ScheduledEntry(rid, phase, num_tokens, computed)  # type: ignore[arg-type]


def pool_trace(num_blocks: int, num_requests: int, swaps: bool = False) -> list[StepRecord]:
    """Two steps on a pool of num_blocks: requests of 10 blocks (block_size 16) decode, the
    last of them is swapped out in step 1 when swaps; the second step frees one request."""
    tables = {f"r{i}": list(range(10 * i, 10 * i + 10)) for i in range(num_requests)}
    running = [entry(rid, "decode", 1, 150) for rid in tables]
    free = num_blocks - 10 * num_requests
    last = f"r{num_requests - 1}"
    later = {rid: t for rid, t in tables.items() if not (swaps and rid == last)}
    extra = ({"preempted": [last], "swapped_out": [last], "swap_out_blocks": 10,
              "swapped": [last]} if swaps else {})
    return [StepRecord(0, 0.0, 1.0, running, free, tables, num_waiting=3, waiting_cause="blocks"),
            StepRecord(1, 1.0, 1.1, [e for e in running if e.request_id in later],
                       free + 10 * swaps, later, finished=["r0"], num_waiting=2,
                       waiting_cause="blocks", **extra)]


def long_tables_trace() -> list[StepRecord]:
    """A 128-block pool (tables beside the grid) whose 4 requests hold 30 blocks each (their
    rows end in "+16"), as 30 short requests finish and 12 are preempted in the step."""
    tables = {f"long{i}": list(range(30 * i, 30 * i + 30)) for i in range(4)}
    running = [entry(rid, "decode", 1, 470) for rid in tables]
    gone = [f"request-{i}" for i in range(42)]
    return [StepRecord(0, 0.0, 1.0, running, 8, tables, finished=gone[:30], preempted=gone[30:])]


def long_trace(num_steps: int, num_requests: int) -> list[StepRecord]:
    """num_steps steps in which 3 of num_requests requests decode at a time, in turn."""
    per = max(num_steps // num_requests, 1)
    return [StepRecord(i, i * 0.01, i * 0.01 + 0.005,
                       [entry(f"q{(i // per + k) % num_requests}", "decode", 1, 50)
                        for k in range(3)], 10, {}, num_waiting=i % 4, waiting_cause="seats")
            for i in range(num_steps)]


def tree_snapshot(depth: int, fanout: int) -> PrefixCacheSnapshot:
    """A prefix tree depth levels deep with fanout children per node (one block each); the
    first path from the root is held by request A."""
    nodes: list[CacheNode] = []

    def grow(parent: int | None, level: int) -> None:
        me = len(nodes)
        nodes.append(CacheNode(me, parent, (me,), 16, 0, level))
        if level + 1 < depth:
            for _ in range(fanout):
                grow(me, level + 1)

    grow(None, 0)
    held = [0]
    while len(held) < depth:
        held.append(held[-1] + 1)
    nodes = [n if n.node_id not in held else CacheNode(n.node_id, n.parent, n.block_ids, 16, 1, 9)
             for n in nodes]
    return PrefixCacheSnapshot("radix", tuple(nodes), {"A": tuple(held)})


def wide_snapshot(branches: int) -> PrefixCacheSnapshot:
    """A system prompt (blocks 0-3) with branches one-block answers under it."""
    nodes = [CacheNode(0, None, (0, 1, 2, 3), 64, 0, 1)]
    nodes += [CacheNode(i, 0, (i + 3,), 16, 0, i) for i in range(1, branches + 1)]
    return PrefixCacheSnapshot("radix", tuple(nodes), {})


def cache_record(snap: PrefixCacheSnapshot) -> StepRecord:
    return StepRecord(0, 0.0, 1.0, [], 0, {}, prefix_cache=snap)


VIEWS: dict[str, Callable[[], View]] = {
    "block table, 8 blocks": lambda: BlockTableView(pool_trace(8, 0), num_blocks=8,
                                                    block_size=16),
    "block table, 128 blocks": lambda: BlockTableView(pool_trace(128, 12), num_blocks=128),
    "block table, long tables, many finished": lambda: BlockTableView(long_tables_trace(),
                                                                      num_blocks=128),
    "block table, 512 blocks": lambda: BlockTableView(pool_trace(512, 40), num_blocks=512),
    "block table, 512 blocks, swaps": lambda: BlockTableView(pool_trace(512, 40, swaps=True),
                                                             num_blocks=512),
    "block table, 2048 blocks": lambda: BlockTableView(pool_trace(2048, 20), num_blocks=2048),
    "block table, 8192 blocks": lambda: BlockTableView(pool_trace(8192, 20), num_blocks=8192),
    "timeline, 2 steps": lambda: BatchTimeline(pool_trace(64, 4, swaps=True)),
    "timeline, 450 steps": lambda: BatchTimeline(long_trace(450, 30)),
    "timeline, 1000 steps, 100 requests": lambda: BatchTimeline(long_trace(1000, 100)),
    "timeline, 1000 steps, by time": lambda: BatchTimeline(long_trace(1000, 100), x="time"),
    "prefix cache, a step without": lambda: PrefixCacheView(
        [cache_record(tree_snapshot(2, 2)), StepRecord(1, 1.0, 2.0, [], 0, {})]),
    "prefix cache, 2 levels": lambda: PrefixCacheView([cache_record(tree_snapshot(2, 3))]),
    "prefix cache, 7 levels deep": lambda: PrefixCacheView([cache_record(tree_snapshot(7, 2))]),
    "prefix cache, 40 branches": lambda: PrefixCacheView([cache_record(wide_snapshot(40))]),
    "roofline": lambda: RooflineExplorer(),
    "roofline, big batch, long prompt": lambda: RooflineExplorer(batch=1024, prompt_len=32768,
                                                                 context_len=32768),
    "KV calculator": lambda: KVCalculator(),
    "KV calculator, overflowing": lambda: KVCalculator("llama-3-70b", hardware="L4",
                                                       context_len=131072, batch=256),
    "tiling, 16 x 16 causal": lambda: TilingView(1024, 1024),
    "tiling, 32 x 32 tiles": lambda: TilingView(1024, 1024, block_m=32, block_n=32),
    "tiling, an extend, uneven tiles": lambda: TilingView(200, 1000, block_n=48),
    "tiling, a decode row": lambda: TilingView(1, 2048, causal=False),
}


def parse(svg_text: str) -> ET.Element:
    root = ET.fromstring(svg_text)
    assert root.tag == NS + "svg"
    return root


def right_edge(el: ET.Element) -> float:
    """How far right an element reaches (user units; text estimated from its length)."""
    tag = el.tag.removeprefix(NS)
    get = lambda k: float(el.get(k, 0))  # noqa: E731
    if tag == "rect":
        return get("x") + get("width")
    if tag == "line":
        return max(get("x1"), get("x2"))
    if tag == "circle":
        return get("cx") + get("r")
    if tag == "polyline":
        return max(float(p.split(",")[0]) for p in el.get("points", "0,0").split())
    if tag == "text":
        run = CHAR_EM * float(el.get("font-size", 11)) * len(el.text or "")
        share = {"start": 1.0, "middle": 0.5, "end": 0.0}[el.get("text-anchor", "start")]
        return get("x") + share * run
    return 0.0


def drawn(root: ET.Element) -> list[ET.Element]:
    """The shapes and texts of a picture, less those in <defs> (patterns) and vertical axis
    labels (a text rotated about its own anchor, which stays near its x)."""
    skip = {id(e) for d in root.iter(NS + "defs") for e in d.iter()}
    moved = [e for e in root.iter() if (e.get("transform") or "rotate").split("(")[0] != "rotate"]
    assert not moved, "a translated or scaled element: map its coordinates in this test"
    return [e for e in root.iter() if id(e) not in skip and not e.get("transform")]


@pytest.mark.parametrize("name", list(VIEWS))
def test_picture_scales_to_its_column_and_stays_narrow(name: str) -> None:
    view = VIEWS[name]()
    for state in states(view):
        view.set_state(state)
        root = parse(view.to_svg())
        width, height = float(root.get("width")), float(root.get("height"))
        assert root.get("viewBox") == f"0 0 {s.num(width)} {s.num(height)}", name
        style = root.get("style", "").replace(" ", "")
        assert "max-width:100%" in style and "height:auto" in style, f"{name}: {style}"
        assert width <= s.MAX_WIDTH, f"{name} at {state}: {width} px wide > {s.MAX_WIDTH}"
        reach = max(right_edge(e) for e in drawn(root))
        assert reach <= width + 2, f"{name} at {state}: drawn to x = {reach:.0f} > {width}"


def states(view: View) -> list[dict]:
    """The view's first and last step, or each option of each dropdown in turn (one control at
    a time: "This Machine" is skipped, it would time this machine)."""
    out: list[dict] = [view.get_state()]
    for c in view.controls():
        if c["kind"] == "range" and c["name"] == "step":
            out.append({"step": c["max"]})
        elif c["kind"] == "select":
            out += [{c["name"]: v} for label, v in c["options"] if label != "This Machine"]
    return out


def test_a_512_block_pool_puts_its_tables_under_the_grid() -> None:
    """The issue's case (chapter 04's 512-block pool drew 1,152 px wide, its tables off-screen
    on a laptop): the grid is 32 blocks a row and the block tables sit under it, so the picture
    is no wider than the small views (620 px) and is read unshrunk in a laptop's column."""
    root = parse(BlockTableView(pool_trace(512, 40), num_blocks=512).to_svg())
    assert float(root.get("width")) <= 640
    blocks = [e for e in root.iter(NS + "rect") if (e.get("class") or "").startswith("block ")]
    grid_bottom = max(float(e.get("y")) + float(e.get("height")) for e in blocks
                      if float(e.get("height")) <= 10)  # the pool's 12 px cells, not the tables'
    header = next(e for e in root.iter(NS + "text") if (e.text or "").startswith("block tables"))
    assert float(header.get("x")) == 0 and float(header.get("y")) > grid_bottom
    small = parse(BlockTableView(pool_trace(128, 12), num_blocks=128).to_svg())
    header = next(e for e in small.iter(NS + "text") if (e.text or "").startswith("block tables"))
    assert float(header.get("x")) > 400, "a labelled grid (<= 128 blocks) keeps them beside it"


def test_a_deep_prefix_tree_is_cut_at_the_last_column_and_named() -> None:
    root = parse(PrefixCacheView([cache_record(tree_snapshot(7, 2))]).to_svg())
    more = [e for e in root.iter(NS + "rect") if e.get("class") == "node more"]
    hidden = sum(int(t.split()[0]) for e in root.iter(NS + "text")
                 if (t := e.text or "").endswith(" blocks") and "nodes" in t)
    shown = len([e for e in root.iter(NS + "rect") if (e.get("class") or "").startswith("node ")
                 and e.get("class") != "node more"])
    assert more and shown + hidden == 2**7 - 1, "every node is drawn or counted in a grey box"
