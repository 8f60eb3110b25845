"""The layout behind PrefixCacheView: a prefix-cache snapshot's nodes as boxes on a grid.

A hash chain keeps one node per block, so an unbranched run of nodes in the same state becomes
one box (the run a radix tree stores as one node). Leaves take consecutive rows and a parent
sits midway between its first and last child, so boxes never overlap; past MAX_CHILDREN
branches of a node, or MAX_ROWS rows in all, the rest share one box of hidden nodes. The tree
is at most MAX_DEPTH boxes deep (so the picture stays within a text column's width): the
subtrees that would go deeper share one such box in the last column.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from minillm.trace import CacheNode, PrefixCacheSnapshot

MAX_CHILDREN, MAX_ROWS = 16, 40
MAX_DEPTH = 4  # columns of boxes: 4 x 180 px + the root is 784 px, within svg.MAX_WIDTH
RECENCY = ("#E3F1FA", "#BFE0F4", "#8FC8EC", "#5AA9DD")  # hatch colours, least to most recent


@dataclass
class Box:
    """One drawn box: a run of nodes (each the only child of the one before, all in the same
    state), or, with nodes empty, the branches left out (hidden) under one parent."""

    nodes: list[CacheNode]
    holders: list[str]
    children: list[Box] = field(default_factory=list)
    hidden: list[CacheNode] = field(default_factory=list)
    depth: int = 0
    row: float = 0.0

    @property
    def blocks(self) -> list[int]:
        return [b for n in self.nodes or self.hidden for b in n.block_ids]

    @property
    def last_used(self) -> int:
        return max(n.last_used for n in self.nodes or self.hidden)

    def subtree(self) -> list[CacheNode]:
        return self.nodes + self.hidden + [n for c in self.children for n in c.subtree()]


def build_tree(snap: PrefixCacheSnapshot) -> list[Box]:
    """The snapshot's nodes as boxes under the root (a node whose parent is not in the
    snapshot hangs from the root); an unbranched run of nodes with the same holders and ref
    count (and, at ref count 0, the same recency level) shares a box."""
    levels = recency_levels(snap)
    holders: dict[int, list[str]] = {}
    for rid, node_ids in snap.holders.items():
        for node_id in node_ids:
            holders.setdefault(node_id, []).append(rid)
    known = {n.node_id for n in snap.nodes}
    children: dict[int | None, list[CacheNode]] = {}
    for n in snap.nodes:
        children.setdefault(n.parent if n.parent in known else None, []).append(n)

    def key(n: CacheNode) -> tuple:
        return n.ref_count, holders.get(n.node_id, []), n.ref_count or levels[n.last_used]

    def run_from(node: CacheNode) -> Box:
        nodes = [node]
        while len(kids := children.get(nodes[-1].node_id, [])) == 1 and key(kids[0]) == key(node):
            nodes.append(kids[0])
        box = Box(nodes, holders.get(node.node_id, []))
        box.children = [run_from(c) for c in children.get(nodes[-1].node_id, [])]
        return box

    return [run_from(n) for n in children.get(None, [])]


def layout(roots: list[Box]) -> list[Box]:
    """Give every box a depth and a row (leaves on consecutive rows, a parent midway between
    its first and last child, so boxes never overlap); returns the boxes drawn, parents first."""
    drawn: list[Box] = []
    next_row = 0

    def place(boxes: list[Box], depth: int) -> list[Box]:
        nonlocal next_row
        shown = boxes
        if len(boxes) > MAX_CHILDREN:  # keep the held and most recently used branches
            ranked = sorted(boxes, key=lambda b: (not b.nodes[0].ref_count, -b.last_used))
            kept = {id(b) for b in ranked[:MAX_CHILDREN - 1]}
            shown = [b for b in boxes if id(b) in kept]
        if depth == MAX_DEPTH - 1 and any(b.children for b in boxes):
            shown = []  # a subtree would go past the last column: one box names them all
        placed = []
        for box in shown:
            if next_row >= MAX_ROWS:
                break
            box.depth = depth
            drawn.append(box)
            box.children = place(box.children, depth + 1)
            box.row = ((box.children[0].row + box.children[-1].row) / 2 if box.children
                       else next_row)
            next_row += not box.children
            placed.append(box)
        placed_ids = {id(b) for b in placed}
        rest = [n for b in boxes if id(b) not in placed_ids for n in b.subtree()]
        if rest:
            more = Box([], [], hidden=rest, depth=depth, row=next_row)
            drawn.append(more)
            placed.append(more)
            next_row += 1
        return placed

    place(roots, 0)
    return drawn


def recency_levels(snap: PrefixCacheSnapshot) -> dict[int, int]:
    """last_used -> 0 (least recent) .. len(RECENCY) - 1, over the evictable nodes' uses."""
    uses = sorted({n.last_used for n in snap.nodes if n.ref_count == 0})
    return {u: (len(RECENCY) - 1) * i // max(len(uses) - 1, 1) if len(uses) > 1
            else len(RECENCY) - 1 for i, u in enumerate(uses)}
