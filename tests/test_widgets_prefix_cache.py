"""PrefixCacheView (widgets/prefix_cache.py): the prefix cache of one step drawn as a tree.

Hand-built snapshots pin what the picture must show for both designs (every node and block,
who holds what, what a step evicted), the caption's counts, the steps without data, and that
deep chains and wide trees are laid out without overlapping boxes.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minillm.trace import CacheNode, PrefixCacheSnapshot, ScheduledEntry, StepRecord
from widgets import PrefixCacheView, prefix_tree
from widgets import prefix_cache as pc
from widgets import svg as s

NS = "{http://www.w3.org/2000/svg}"


def record(step: int, snap: PrefixCacheSnapshot | None, running: str = "") -> StepRecord:
    scheduled = [ScheduledEntry(rid, "decode", 1, 40) for rid in running]
    return StepRecord(step, float(step), step + 1.0, scheduled, 0, {}, prefix_cache=snap)


def chain(first: int, parent: int | None, count: int, ref: int, used: int) -> list[CacheNode]:
    """count hash nodes of one 16-token block each, ids first.., each the child of the last."""
    return [CacheNode(b, parent if b == first else b - 1, (b,), 16, ref, used)
            for b in range(first, first + count)]


def hash_snapshot(evicted: tuple[int, ...] = ()) -> PrefixCacheSnapshot:
    """A and B share a 3-block system prompt (blocks 0-2); A goes on with 3, 4, B with 5; an
    older answer (6, 7) and a newer one (8) no request holds."""
    nodes = (chain(0, None, 3, 2, 5) + chain(3, 2, 2, 1, 5) + [CacheNode(5, 2, (5,), 9, 1, 5)]
             + chain(6, 2, 2, 0, 1) + [CacheNode(8, 2, (8,), 16, 0, 4)])
    return PrefixCacheSnapshot("hash", tuple(nodes), {"A": (0, 1, 2, 3, 4), "B": (0, 1, 2, 5)},
                               evicted)


def radix_snapshot() -> PrefixCacheSnapshot:
    """The same cache as a radix tree: one node per run of blocks."""
    nodes = (CacheNode(10, None, (0, 1, 2), 48, 2, 5), CacheNode(11, 10, (3, 4), 32, 1, 5),
             CacheNode(12, 10, (5,), 9, 1, 5), CacheNode(13, 10, (6, 7), 32, 0, 1),
             CacheNode(14, 10, (8,), 16, 0, 4))
    return PrefixCacheSnapshot("radix", nodes, {"A": (10, 11), "B": (10, 12)})


def parse(svg_text: str) -> ET.Element:
    root = ET.fromstring(svg_text)
    assert root.tag == NS + "svg"
    return root


def shown(root: ET.Element) -> str:
    """Every text and hover title of a picture, one per line."""
    return "\n".join(el.text or "" for el in root.iter() if el.tag in (NS + "text", NS + "title"))


def node_rects(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(NS + "rect") if (r.get("class") or "").startswith("node")]


def hovers(root: ET.Element) -> list[str]:
    """The hover text of every node box."""
    return [r.findtext(NS + "title") or "" for r in node_rects(root)]


def named(hover_texts: list[str], what: str) -> list[int]:
    """The node (what="nodes?") or block (what="blocks") ids the hover texts list."""
    found = [re.search(rf"\b{what} ([\d, ]+)", h) for h in hover_texts]
    return sorted(int(i) for m in found if m for i in m.group(1).split(","))


def box(r: ET.Element) -> tuple[float, float, float, float]:
    return tuple(float(r.get(k)) for k in ("x", "y", "width", "height"))  # type: ignore[return-value]


def assert_no_overlap(root: ET.Element) -> None:
    """No two node boxes share any area, and each has room under it for its holder tags."""
    boxes = sorted(box(r) for r in node_rects(root))
    for i, (x, y, w, h) in enumerate(boxes):
        for x2, y2, w2, h2 in boxes[i + 1:]:
            apart = x + w <= x2 or x2 + w2 <= x or y + h + 14 <= y2 or y2 + h2 + 14 <= y
            assert apart, f"boxes at ({x}, {y}) and ({x2}, {y2}) overlap"


def test_hash_tree_shows_every_node_block_and_holder() -> None:
    view = PrefixCacheView([record(0, hash_snapshot(), running="AB")])
    root = parse(view.to_svg())
    assert named(hovers(root), "nodes?") == named(hovers(root), "blocks") == list(range(9))
    assert "blocks 0 1 2" in shown(root) and "48 tok · 3 nodes · ×2" in shown(root)
    assert any(h.startswith("nodes 0, 1, 2 (3 hash nodes") and "held by A, B (ref count 2)" in h
               for h in hovers(root))
    assert "node 5: blocks 5; 9 tokens; held by B (ref count 1)" in hovers(root)
    # the shared prompt is one box with a thick outline, filled with its first holder's colour
    rects = node_rects(root)
    shared = [r for r in rects if "blocks 0, 1, 2" in (r.findtext(NS + "title") or "")]
    assert len(shared) == 1 and shared[0].get("stroke-width") == "2.5"
    assert shared[0].get("fill") == view.colors["A"] == s.owner_color(0)
    assert len(rects) == 5  # the prompt, A's and B's continuations, two evictable answers
    tags = [r.findtext(NS + "title") for r in root.iter(NS + "rect") if r.get("class") == "holder"]
    assert tags.count("held by request A") == 2 and tags.count("held by request B") == 2


def test_evictable_nodes_are_hatched_by_recency() -> None:
    root = parse(PrefixCacheView([record(0, hash_snapshot())]).to_svg())
    fills = {(r.findtext(NS + "title") or "").split(":")[0]: r.get("fill")
             for r in node_rects(root) if r.get("class") == "node evictable"}
    assert fills == {"nodes 6, 7 (2 hash nodes, each the only child of the one before)":
                     "url(#minillm-lru-0)", "node 8": f"url(#minillm-lru-{len(pc.RECENCY) - 1})"}


def test_radix_tree_draws_one_box_per_node() -> None:
    view = PrefixCacheView([record(0, radix_snapshot())])
    root = parse(view.to_svg())
    text = shown(root)
    assert "radix · 5 nodes · 9 blocks (137 tokens)" in text
    assert "blocks held 6, evictable 3, evicted this step 0" in text
    for node_id in range(10, 15):
        assert f"node {node_id}" in text
    assert len(node_rects(root)) == 5
    assert view.counts() == pc.CacheCounts("radix", 5, 9, 137, 6, 3, 0)


def test_evicted_blocks_appear_with_the_node_that_held_them() -> None:
    before = hash_snapshot()
    after = PrefixCacheSnapshot("hash", tuple(n for n in before.nodes if n.node_id not in (6, 7)),
                                before.holders, evicted=(6, 7))
    view = PrefixCacheView([record(0, before), record(1, after)])
    root = parse(view.to_svg())
    ghosts = [r for r in root.iter(NS + "rect") if r.get("class") == "evicted"]
    assert [g.findtext(NS + "title") for g in ghosts] == [
        "block 6: evicted in this step (it was in node 6, child of node 2)",
        "block 7: evicted in this step (it was in node 7, child of node 6)"]
    assert "evicted this step 2" in shown(root)
    assert "evicted" not in " ".join(r.get("class") or "" for r in
                                     parse(PrefixCacheView([record(0, before)]).to_svg()).iter())


def test_many_evicted_blocks_wrap_and_the_rest_are_named() -> None:
    snap = PrefixCacheSnapshot("hash", tuple(chain(0, None, 2, 0, 1)), {},
                               evicted=tuple(range(100, 160)))
    root = parse(PrefixCacheView([record(0, snap)]).to_svg())
    ghosts = [box(r) for r in root.iter(NS + "rect") if r.get("class") == "evicted"]
    assert len(ghosts) == pc.MAX_GHOSTS
    assert max(x + w for x, _, w, _ in ghosts) <= float(root.get("width"))
    assert max(y + h for _, y, _, h in ghosts) <= float(root.get("height"))
    assert "+12 more" in shown(root)
    assert f"evicted: blocks {', '.join(map(str, range(100, 160)))}" in shown(root)


def test_step_selects_the_snapshot_and_the_slider_replays() -> None:
    trace = [record(0, radix_snapshot()), record(1, hash_snapshot()), record(2, None)]
    view = PrefixCacheView(trace)
    assert view.step == 1  # the last step that recorded the cache
    assert "hash ·" in shown(parse(view.to_svg()))
    assert view.controls() == [pc.slider("step", 0, 2, play=True)]
    view.set_state({"step": 0})
    assert "radix ·" in shown(parse(view.to_svg()))
    view.step = 99
    assert view.step == 2
    widget = PrefixCacheView(trace, step=0).widget()
    first = widget.svg
    widget.values = {"step": 1}
    assert widget.svg != first and "Prefix cache at step 1 (2 of 3)" in widget.svg
    bundle = view._repr_mimebundle_()
    assert f'<div class="mv-picture">{view.to_svg()}</div>' in bundle["text/html"]


def test_steps_without_data_and_an_empty_cache_say_so() -> None:
    empty = PrefixCacheSnapshot("radix", (), {})
    view = PrefixCacheView([record(0, None), record(1, empty)], step=0)
    assert view.snapshot() is None and view.counts() is None
    assert pc.NO_DATA in shown(parse(view.to_svg()))
    view.step = 1
    root = parse(view.to_svg())
    assert "the cache is empty" in shown(root) and node_rects(root) == []
    assert view.counts() == pc.CacheCounts("radix", 0, 0, 0, 0, 0, 0)


def test_a_trace_without_snapshots_is_an_error_that_says_what_to_turn_on() -> None:
    with pytest.raises(ValueError, match="enable_prefix_caching=True"):
        PrefixCacheView([record(0, None), record(1, None)])
    with pytest.raises(ValueError, match="none of the trace's 0 steps"):
        PrefixCacheView([])


def test_a_deep_hash_chain_is_compressed_into_runs() -> None:
    """150 blocks: a 100-block prompt held by A, B; A's 30 more; 20 old evictable ones."""
    nodes = chain(0, None, 100, 2, 9) + chain(100, 99, 30, 1, 9) + chain(130, 129, 20, 0, 2)
    snap = PrefixCacheSnapshot("hash", tuple(nodes), {"A": tuple(range(130)),
                                                      "B": tuple(range(100))})
    root = parse(PrefixCacheView([record(0, snap)]).to_svg())
    rects = node_rects(root)
    assert len(rects) == 3 and float(root.get("width")) < 1000
    assert [box(r)[0] for r in rects] == sorted(box(r)[0] for r in rects)  # left to right
    text = shown(root)
    assert "blocks 0 1 2 3 4 … 99 (100)" in text and "1600 tok · 100 nodes · ×2" in text
    assert named(hovers(root), "nodes?") == named(hovers(root), "blocks") == list(range(150))
    assert any(h.startswith("nodes 130, 131") and "last used at step 2" in h
               for h in hovers(root))
    assert_no_overlap(root)


def test_a_wide_tree_keeps_held_branches_and_summarises_the_rest() -> None:
    children = [CacheNode(i, 0, (i, 100 + i), 32, 1 if i % 5 == 0 else 0, i) for i in range(1, 41)]
    snap = PrefixCacheSnapshot("radix", (CacheNode(0, None, (0,), 16, 8, 40), *children),
                               {f"r{i}": (0, i) for i in range(5, 41, 5)})
    root = parse(PrefixCacheView([record(0, snap)]).to_svg())
    rects = node_rects(root)
    assert len(rects) == 1 + prefix_tree.MAX_CHILDREN
    more = [r for r in rects if r.get("class") == "node more"]
    assert len(more) == 1 and f"+{40 - prefix_tree.MAX_CHILDREN + 1} more branches" in shown(root)
    text = " ".join(hovers(root))
    for i in range(5, 41, 5):  # every held branch is drawn
        assert f"node {i}: blocks {i}, {100 + i}; 32 tokens; held by r{i}" in text
    assert named(hovers(root), "nodes?") == list(range(41))
    assert named(hovers(root), "blocks") == sorted([0, *range(1, 41), *range(101, 141)])
    assert_no_overlap(root)


@st.composite
def random_caches(draw: st.DrawFn) -> PrefixCacheSnapshot:
    """A random forest of up to 60 nodes (parents before children), some held by requests."""
    size = draw(st.integers(0, 60))
    nodes, holders = [], {}
    for i in range(size):
        parent = draw(st.one_of(st.none(), st.integers(0, i - 1))) if i else None
        held = draw(st.booleans())
        nodes.append(CacheNode(i, parent, (i,), 16, int(held), draw(st.integers(0, 5))))
        if held:
            holders.setdefault(f"r{i % 4}", []).append(i)
    return PrefixCacheSnapshot(draw(st.sampled_from(["hash", "radix"])), tuple(nodes),
                               {k: tuple(v) for k, v in holders.items()})


@settings(max_examples=40, deadline=None)
@given(random_caches())
def test_any_cache_is_drawn_without_overlaps_and_names_every_node(
        snap: PrefixCacheSnapshot) -> None:
    root = parse(PrefixCacheView([record(0, snap)]).to_svg())
    assert_no_overlap(root)
    assert named(hovers(root), "nodes?") == [n.node_id for n in snap.nodes]
    assert named(hovers(root), "blocks") == [b for n in snap.nodes for b in n.block_ids]


@pytest.fixture(scope="module", params=["hash", "radix"])
def engine_trace(request: pytest.FixtureRequest) -> list[StepRecord]:
    """A real run on the shipped model: four prompts share a 3-block story opening, in a pool
    of 12 blocks small enough that requests are preempted and cached blocks evicted."""
    from minillm import LLM, SamplingParams

    llm = LLM(num_kv_blocks=12, block_size=16, enable_prefix_caching=True,
              prefix_caching=request.param, max_num_batched_tokens=64, device="cpu")
    system = "Once upon a time there was a little house by the sea. " * 3
    llm.generate([system + p for p in ("The king", "A cat", "The old man", "She said")],
                 SamplingParams(max_tokens=24))
    assert llm.stats()["prefix_cache_hits"] > 0
    return llm.trace


def test_an_engine_trace_replays_every_step(engine_trace: list[StepRecord]) -> None:
    view = PrefixCacheView(engine_trace)
    held_somewhere = False
    for i, rec in enumerate(engine_trace):
        view.step = i
        snap = rec.prefix_cache
        assert snap is not None  # the engine records the cache at every traced step
        root = parse(view.to_svg())
        assert_no_overlap(root)
        assert named(hovers(root), "nodes?") == sorted(n.node_id for n in snap.nodes)
        assert named(hovers(root), "blocks") == sorted(b for n in snap.nodes for b in n.block_ids)
        tags = {r.findtext(NS + "title") for r in root.iter(NS + "rect")
                if r.get("class") == "holder"}
        holding = {rid for rid, nodes in snap.holders.items() if nodes}
        assert {f"held by request {rid}" for rid in holding} <= tags
        held_somewhere |= bool(holding)
        ghosts = [r.findtext(NS + "title") for r in root.iter(NS + "rect")
                  if r.get("class") == "evicted"]
        assert [g.split(":")[0] for g in ghosts] == [f"block {b}" for b in snap.evicted]
    assert held_somewhere
