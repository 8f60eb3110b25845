"""PrefixCacheView: the prefix cache at one engine step (StepRecord.prefix_cache), as a tree.

The root is at the left, one column per depth. A hash chain keeps one node per block (a
1,024-token system prompt is a chain of 64 nodes), so an unbranched run of nodes in the same
state is drawn as one box that lists its blocks: the run a radix tree stores as one node. The
layout (widgets/prefix_tree.py) draws at most MAX_CHILDREN branches of a node, about
MAX_ROWS rows and MAX_DEPTH columns in all; the rest share one grey box whose hover text names
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minillm.trace import PrefixCacheSnapshot, StepRecord
from widgets import svg as s
from widgets.base import TraceView, slider
from widgets.block_table import request_colors
from widgets.prefix_tree import RECENCY, Box, build_tree, layout, recency_levels

BOX_W, BOX_H = 156, 30  # px of a node's box; its holder tags go in the 14 px under it
COL_W, ROW_H = BOX_W + 24, BOX_H + 22  # px per tree depth and per leaf row
ROOT_W, TOP = 40, 58  # the root marker's width; the y of the first row
LABEL_CHARS = 28  # characters of a 9 px label that fit in a box
GHOSTS_PER_ROW, MAX_GHOSTS = 24, 48  # evicted blocks drawn in the strip; the rest counted
NO_DATA = ("no prefix-cache data in this step: run with enable_prefix_caching=True and block "
           "data traced")


@dataclass(frozen=True)
class CacheCounts:
    """What the caption says about one snapshot: nodes, blocks and tokens cached, blocks held
    by running requests (ref count > 0) or evictable (ref count 0), blocks evicted in the step."""

    design: str
    nodes: int
    blocks: int
    tokens: int
    held_blocks: int
    evictable_blocks: int
    evicted_blocks: int


def cache_counts(snap: PrefixCacheSnapshot) -> CacheCounts:
    """The caption's counts for one snapshot (blocks, not tokens, for held and evictable)."""
    held = sum(len(n.block_ids) for n in snap.nodes if n.ref_count > 0)
    blocks = sum(len(n.block_ids) for n in snap.nodes)
    return CacheCounts(snap.design, len(snap.nodes), blocks, sum(n.num_tokens for n in snap.nodes),
                       held, blocks - held, len(snap.evicted))


def block_label(blocks: list[int]) -> str:
    """'blocks 4 5 6', or 'blocks 4 5 … 99 (64)' where the list does not fit in a box."""
    text = ("block " if len(blocks) == 1 else "blocks ") + " ".join(map(str, blocks))
    if len(text) <= LABEL_CHARS:
        return text
    tail, head = f" … {blocks[-1]} ({len(blocks)})", "blocks"
    for b in blocks:
        if len(f"{head} {b}{tail}") > LABEL_CHARS:
            break
        head += f" {b}"
    return head + tail


def ids(values: Sequence[object]) -> str:
    """'1, 2, 3': ids as a hover text lists them."""
    return ", ".join(map(str, values))


class PrefixCacheView(TraceView):
    """The prefix cache at trace[step] as a tree of cached blocks, coloured by who holds them.

    trace: StepRecords of an engine run with enable_prefix_caching=True and block data traced
    (llm.trace); step: which record (default the last with a snapshot). A node held by running
    requests takes its first holder's colour (as in BlockTableView) and lists every holder under
    it, a thick outline when shared (ref count > 1); an evictable node (ref count 0) is hatched,
    paler the longer ago it was used; the blocks the step evicted are crossed out under the tree.
    """

    def __init__(self, trace: Sequence[StepRecord], step: int | None = None):
        self.trace = list(trace)
        with_data = [i for i, rec in enumerate(self.trace) if rec.prefix_cache is not None]
        if not with_data:
            raise ValueError(
                f"PrefixCacheView needs steps that record the prefix cache; none of the trace's "
                f"{len(self.trace)} steps does: run LLM(enable_prefix_caching=True) with block "
                "data traced (EngineConfig.trace_block_tables, on by default for pools up to "
                "TRACE_BLOCKS_MAX_POOL blocks)")
        self.colors = request_colors(self.trace)
        for rec in self.trace:  # a holder the scheduled lists never named still gets a colour
            for rid in rec.prefix_cache.holders if rec.prefix_cache else ():
                self.colors.setdefault(rid, s.owner_color(len(self.colors)))
        self.step = with_data[-1] if step is None else step

    def controls(self) -> list[dict]:
        return [slider("step", 0, len(self.trace) - 1, play=True)]

    def snapshot(self) -> PrefixCacheSnapshot | None:
        """The prefix cache after the selected step (None where the step recorded none)."""
        return self.trace[self.step].prefix_cache

    def counts(self) -> CacheCounts | None:
        """The caption's counts for the selected step (None where it recorded no cache)."""
        snap = self.snapshot()
        return None if snap is None else cache_counts(snap)

    def to_svg(self) -> str:
        rec, snap = self.trace[self.step], self.snapshot()
        title = f"Prefix cache at step {rec.step} ({self.step + 1} of {len(self.trace)})"
        if snap is None:
            body = s.text(0, 16, title, size=13, font_weight="bold") + s.text(0, 40, NO_DATA)
            return s.svg(max(6 * len(NO_DATA), 620), 56, body, title=title)
        c = cache_counts(snap)
        caption = (f"{c.design} · {c.nodes} nodes · {c.blocks} blocks ({c.tokens:,} tokens) · "
                   f"blocks held {c.held_blocks}, evictable {c.evictable_blocks}, evicted this "
                   f"step {c.evicted_blocks}")
        boxes = layout(build_tree(snap))
        rows = max((b.row for b in boxes), default=0) + 1
        cols = max((b.depth for b in boxes), default=0) + 1
        tree_h = TOP + rows * ROW_H
        body = [s.hatch(f"minillm-lru-{i}", color) for i, color in enumerate(RECENCY)]
        body += [s.text(0, 16, title, size=13, font_weight="bold"), s.text(0, 34, caption)]
        body.append(self._tree_svg(snap, boxes))
        y = tree_h + 8
        if snap.evicted:
            body.append(self._evicted_svg(snap.evicted, y))
            y += 24 + 24 * -(-min(len(snap.evicted), MAX_GHOSTS) // GHOSTS_PER_ROW)
        body.append(self._legend_svg(y + 12))
        width = max(ROOT_W + 24 + cols * COL_W, 6 * len(caption), 640)
        return s.svg(width, y + 44, "".join(body), title=title)

    def _tree_svg(self, snap: PrefixCacheSnapshot, boxes: list[Box]) -> str:
        tops = [b for b in boxes if b.depth == 0]
        root_y = TOP + (tops[0].row + tops[-1].row) / 2 * ROW_H if tops else TOP
        out = [s.rect(0, root_y, ROOT_W, BOX_H, s.ROLE["background"], stroke=s.ROLE["text"],
                      rx=4, title=f"the root of the {snap.design} prefix cache", class_="root"),
               s.text(ROOT_W / 2, root_y + BOX_H / 2 + 4, "root", size=10, anchor="middle")]
        if not tops:
            out.append(s.text(ROOT_W + 12, root_y + BOX_H / 2 + 4,
                              "the cache is empty: no cached blocks", fill=s.ROLE["grid"]))
        edges = [(None, b) for b in tops] + [(p, c) for p in boxes for c in p.children]
        for parent, child in edges:
            x0, y0 = (ROOT_W, root_y) if parent is None else self._corner(parent)
            x1, y1 = self._corner(child)
            xm, y0, y1 = x1 - (COL_W - BOX_W) / 2, y0 + BOX_H / 2, y1 + BOX_H / 2
            out.append(s.polyline([(x0 + (parent is not None) * BOX_W, y0), (xm, y0), (xm, y1),
                                   (x1, y1)], stroke=s.ROLE["grid"]))
        levels = recency_levels(snap)
        out += [self._box_svg(b, snap.design, levels) for b in boxes]
        return "".join(out)

    def _corner(self, box: Box) -> tuple[float, float]:
        """The top-left corner of a box."""
        return ROOT_W + 24 + box.depth * COL_W, TOP + box.row * ROW_H

    def _box_svg(self, box: Box, design: str, levels: dict[int, int]) -> str:
        """A run of nodes: its fill tells who holds it, its two lines its blocks and tokens."""
        if not box.nodes:
            return self._more_svg(box)
        ref, tokens = box.nodes[0].ref_count, sum(n.num_tokens for n in box.nodes)
        node_ids, uses = [n.node_id for n in box.nodes], sorted({n.last_used for n in box.nodes})
        if ref > 0:
            fill = self.colors.get(box.holders[0] if box.holders else "", s.ROLE["grid"])
            state = f"held by {ids(box.holders) or 'requests not named'} (ref count {ref})"
            ink = {"fill": s.text_color_on(fill)}
        else:  # a white halo keeps the text readable on the hatch
            fill = f"url(#minillm-lru-{levels[box.last_used]})"
            state = f"ref count 0, evictable; last used at step {uses[0]}" + (
                f"–{uses[-1]}" if len(uses) > 1 else "")
            ink = {"stroke": s.ROLE["background"], "stroke_width": 2.5, "paint_order": "stroke"}
        one = len(node_ids) == 1
        name = f"node {node_ids[0]}" if one else (
            f"nodes {ids(node_ids)} ({len(node_ids)} {design} nodes, each the only child of the "
            "one before)")
        line2 = (f"{tokens} tok · " + (f"node {node_ids[0]}" if one else f"{len(node_ids)} nodes")
                 + (f" · ×{ref}" if ref > 1 else ""))
        x, y = self._corner(box)
        out = [s.rect(x, y, BOX_W, BOX_H, fill, rx=3,
                      title=f"{name}: blocks {ids(box.blocks)}; {tokens} tokens; {state}",
                      stroke=s.ROLE["shared"] if ref > 1 else s.ROLE["text"],
                      stroke_width=2.5 if ref > 1 else 1,
                      class_="node held" if ref > 0 else "node evictable")]
        out += [s.text(x + 6, y + 12 + 13 * i, line, size=9, pointer_events="none", **ink)
                for i, line in enumerate((block_label(box.blocks), line2))]
        return "".join(out) + self._tags_svg(box.holders, x, y + BOX_H + 3)

    def _more_svg(self, box: Box) -> str:
        """The branches left out under one parent, as one grey box that names them."""
        x, y = self._corner(box)
        hidden = {n.node_id for n in box.hidden}
        branches = sum(n.parent not in hidden for n in box.hidden)
        hover = f"not drawn: nodes {ids(sorted(hidden))}; blocks {ids(box.blocks)}"
        return (s.rect(x, y, BOX_W, BOX_H, s.ROLE["waiting"], title=hover, rx=3,
                       stroke=s.ROLE["grid"], stroke_dasharray="3 2", class_="node more")
                + s.text(x + 6, y + 12, f"+{branches} more branches", size=9)
                + s.text(x + 6, y + 25, f"{len(hidden)} nodes, {len(box.blocks)} blocks", size=9))

    def _tags_svg(self, holders: list[str], x: float, y: float) -> str:
        """A colour swatch and the id of each holder, in a row under a box."""
        out, cx = [], x
        for i, rid in enumerate(holders):
            tag = rid if len(rid) <= 6 else rid[:5] + "…"
            wide = 13 + 5.5 * len(tag)
            if cx + wide > x + BOX_W:  # the box's hover text names them all
                out.append(s.text(cx, y + 8, f"+{len(holders) - i}", size=8))
                break
            out.append(s.rect(cx, y, 8, 8, self.colors.get(rid, s.ROLE["grid"]),
                              title=f"held by request {rid}", class_="holder"))
            out.append(s.text(cx + 10, y + 8, tag, size=8))
            cx += wide
        return "".join(out)

    def _evicted_svg(self, evicted: Sequence[int], y: float) -> str:
        """The blocks evicted in the step as crossed-out ghosts, with the node that held each
        in the last earlier snapshot."""
        before = next((self.trace[i].prefix_cache for i in range(self.step - 1, -1, -1)
                       if self.trace[i].prefix_cache is not None), None)
        was = {b: n for n in (before.nodes if before else ()) for b in n.block_ids}
        count = "1 block" if len(evicted) == 1 else f"{len(evicted)} blocks"
        out = [s.text(0, y + 10, f"evicted in this step ({count}, cached KV thrown away to make "
                                 "room):", font_weight="bold")]
        for i, b in enumerate(evicted[:MAX_GHOSTS]):
            gx, gy = i % GHOSTS_PER_ROW * 24, y + 16 + i // GHOSTS_PER_ROW * 24
            node = was.get(b)
            hover = f"block {b}: evicted in this step" + (
                f" (it was in node {node.node_id}, child of node {node.parent})" if node else "")
            out.append(s.rect(gx + 1, gy, 22, 20, s.ROLE["free"], title=hover,
                              class_="evicted", stroke=s.ROLE["preempted"], stroke_dasharray="3 2"))
            out.append(s.line(gx + 3, gy + 2, gx + 21, gy + 18, stroke=s.ROLE["preempted"]))
            out.append(s.text(gx + 12, gy + 14, b, size=8, anchor="middle",
                              pointer_events="none"))
        if len(evicted) > MAX_GHOSTS:
            more = s.text(GHOSTS_PER_ROW * 24 + 4, y + 54, f"+{len(evicted) - MAX_GHOSTS} more")
            out.append(s.group(s.title_el(f"evicted: blocks {ids(evicted)}") + more))
        return "".join(out)

    def _legend_svg(self, y: float) -> str:
        held = [(s.owner_color(0), "held (colour = request; tags: the requests holding it)"),
                (s.owner_color(1), "shared (ref count > 1)",
                 {"stroke": s.ROLE["shared"], "stroke_width": 2.5})]
        cached = [(f"url(#minillm-lru-{len(RECENCY) - 1})", "ref 0, used recently"),
                  ("url(#minillm-lru-0)", "ref 0, used longest ago (LRU evicts first)"),
                  (s.ROLE["free"], "evicted this step",
                   {"stroke": s.ROLE["preempted"], "stroke_dasharray": "3 2"})]
        return s.legend(held, 0, y) + s.legend(cached, 0, y + 18)
