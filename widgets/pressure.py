"""Memory pressure drawn on the trace views: swaps to the host pool and why requests wait.

Shared by BatchTimeline (swap-out / swap-in cells, the span a request's K/V sit in host memory,
a strip of waiting requests coloured by cause) and BlockTableView (the host pool panel). It
reads only StepRecord fields, all of which default to empty, so an old trace (or a run without
swap) simply has nothing to draw here.

What the trace gives: swapped_out / swapped_in (request ids copied out / in by a step),
swap_out_blocks / swap_in_blocks (blocks copied, summed over the step's requests), swapped (every
request in the host pool after the step), num_waiting and waiting_cause (what stopped admission,
minillm.request.WaitingCause). A swapped request's block count is exact when its swap-out
step moved only it; otherwise it is the length of its last traced block table (the blocks it
held when preempted), or, when block tables are not traced (big pools), ceil(tokens / block
size) from its last scheduled step.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence

from minillm.trace import StepRecord
from widgets import svg as s

# Swap states next to the phases of widgets.svg.ROLE. Reddish purple is the one Okabe-Ito
# colour no other request state uses; its pale tint is the span in host memory, and swap-in is
# sky blue so it reads apart from the decode blue that follows it.
SWAP_ROLE: dict[str, str] = {
    "swap-out": s.PALETTE["reddish_purple"],
    "swapped": "#EFD3E3",
    "swap-in": s.PALETTE["sky_blue"],
}
SWAP_LABEL = {"swap-out": "swap out", "swapped": "K/V in host memory", "swap-in": "swap in"}

# Waiting causes: KV memory in the preemption colour (the same shortage), the token budget in
# the prefill colour (prefill chunks spend it), seats in yellow, a static batch in dark grey.
CAUSE_COLOR: dict[str, str] = {
    "seats": s.PALETTE["yellow"],
    "blocks": s.ROLE["preempted"],
    "budget": s.ROLE["prefill"],
    "batch": "#6E6E6E",
}
CAUSE_TEXT: dict[str, str] = {
    "seats": "no free seat (max_num_seqs)",
    "blocks": "no free KV blocks",
    "budget": "token budget spent (max_num_batched_tokens)",
    "batch": "a static batch still running",
}
MAX_HOST_ROWS = 8  # swapped requests listed in the host pool panel


def has_swaps(trace: Sequence[StepRecord]) -> bool:
    """Whether any step swapped a request out or in (else the views draw no swap legend)."""
    return any(rec.swapped_out or rec.swapped_in or rec.swapped for rec in trace)


def records_waiting(trace: Sequence[StepRecord]) -> bool:
    """Whether the trace records anyone waiting (old traces leave num_waiting at 0)."""
    return any(rec.num_waiting or rec.waiting_cause for rec in trace)


def swap_sizes(trace: Sequence[StepRecord], block_size: int) -> dict[str, list[tuple[int, int]]]:
    """request id -> [(trace index of a swap-out, blocks copied out)], in trace order."""
    tables: dict[str, int] = {}  # blocks in each request's last traced table
    tokens: dict[str, int] = {}  # tokens held after each request's last scheduled step
    sizes: dict[str, list[tuple[int, int]]] = {}
    for i, rec in enumerate(trace):
        for rid in rec.swapped_out:  # preempted before the step ran: its last table still holds
            if len(rec.swapped_out) == 1:
                blocks = rec.swap_out_blocks
            elif rid in tables:
                blocks = tables[rid]
            else:
                blocks = -(-tokens.get(rid, 0) // block_size)
            sizes.setdefault(rid, []).append((i, blocks))
        for e in rec.scheduled:
            tokens[e.request_id] = e.num_computed_tokens + e.num_tokens
        for rid, table in rec.block_tables.items():
            tables[rid] = len(table)
    return sizes


def blocks_of(sizes: dict[str, list[tuple[int, int]]], rid: str, index: int) -> int | None:
    """The blocks rid swapped out at or before trace[index] (its latest swap-out), or None."""
    found = [blocks for i, blocks in sizes.get(rid, []) if i <= index]
    return found[-1] if found else None


def blocks_text(n: int | None) -> str:
    return "" if n is None else f" ({n} block{'s' * (n != 1)})"


def swap_moves(rec: StepRecord, out_label: str, in_label: str) -> list[str]:
    """The step's copies to and from the host pool, one phrase each (none: empty)."""
    moves = []
    if rec.swapped_out:
        moves.append(f"{out_label} {', '.join(rec.swapped_out)} "
                     f"({rec.swap_out_blocks} blocks → host)")
    if rec.swapped_in:
        moves.append(f"{in_label} {', '.join(rec.swapped_in)} "
                     f"({rec.swap_in_blocks} blocks ← host)")
    return moves


def step_summary(rec: StepRecord, sizes: dict[str, list[tuple[int, int]]],
                 index: int) -> str:
    """One line on a step's memory pressure: swaps (with blocks), host pool, who waits and why."""
    parts = swap_moves(rec, "swapped out req", "swapped in req")
    recomputed = [rid for rid in rec.preempted if rid not in rec.swapped_out]
    if recomputed:
        parts.append(f"preempted for recompute: req {', '.join(recomputed)}")
    if rec.swapped:
        held = sum(blocks_of(sizes, rid, index) or 0 for rid in rec.swapped)
        parts.append(f"{len(rec.swapped)} in host pool ({held} blocks)")
    if rec.num_waiting or rec.waiting_cause:
        cause = CAUSE_TEXT.get(rec.waiting_cause or "", "nothing stopped admission")
        parts.append(f"{rec.num_waiting} waiting: {cause}")
    return " · ".join(parts)


def legend_items(trace: Sequence[StepRecord]) -> list[tuple]:
    """Legend entries for the swap states and the waiting causes this trace shows."""
    items: list[tuple] = []
    if has_swaps(trace):
        items += [(SWAP_ROLE[k], SWAP_LABEL[k]) for k in ("swap-out", "swapped", "swap-in")]
    causes = {rec.waiting_cause for rec in trace if rec.waiting_cause}
    items += [(CAUSE_COLOR[c], f"wait: {c}") for c in CAUSE_COLOR if c in causes]
    return items


def swapped_runs(trace: Sequence[StepRecord], col: Callable[[int], int],
                 row: Callable[[str], int]) -> dict[int, list[tuple[int, int, int]]]:
    """Per row, the runs of columns where a request of the row sat in the host pool:
    (first column, last column, trace index of the run's first step)."""
    marks: dict[int, dict[int, int]] = {}
    for i, rec in enumerate(trace):
        for rid in rec.swapped:
            marks.setdefault(row(rid), {}).setdefault(col(i), i)
    runs: dict[int, list[tuple[int, int, int]]] = {}
    for r, cols in marks.items():
        for c in sorted(cols):
            if runs.get(r) and runs[r][-1][1] == c - 1:
                c0, _, i0 = runs[r][-1]
                runs[r][-1] = (c0, c, i0)
            else:
                runs.setdefault(r, []).append((c, c, cols[c]))
    return runs


def waiting_columns(trace: Sequence[StepRecord],
                    col: Callable[[int], int]) -> dict[int, tuple[int, str | None]]:
    """Per column: the most requests left waiting in its steps and the commonest cause."""
    most: dict[int, int] = {}
    causes: dict[int, Counter] = {}
    for i, rec in enumerate(trace):
        c = col(i)
        most[c] = max(most.get(c, 0), rec.num_waiting)
        if rec.waiting_cause:
            causes.setdefault(c, Counter())[rec.waiting_cause] += 1
    return {c: (n, causes[c].most_common(1)[0][0] if c in causes else None)
            for c, n in most.items()}


def waiting_strip_svg(trace: Sequence[StepRecord], num_cols: int, col: Callable[[int], int],
                      col_x: Callable[[int], tuple[float, float]],
                      steps_of: Callable[[int], str], x: float, y: float, h: float) -> str:
    """Bars of waiting requests per column, coloured by what stopped admission; equal
    neighbours share one rect (the strip stays small on long traces)."""
    cols = waiting_columns(trace, col)
    top = max((n for n, _ in cols.values()), default=0) or 1
    out = [s.text(x - 6, y + h - 2, "waiting", size=9, anchor="end"),
           s.line(x, y + h, col_x(num_cols - 1)[1], y + h)]
    c = 0
    while c < num_cols:
        n, cause = cols.get(c, (0, None))
        end = c
        while end + 1 < num_cols and cols.get(end + 1, (0, None)) == (n, cause):
            end += 1
        if n:
            x0, x1 = col_x(c)[0], col_x(end)[1]
            bh = max(n / top * h, 1.5)
            steps = steps_of(c) if end == c else f"{steps_of(c)} to {steps_of(end)}"
            why = CAUSE_TEXT.get(cause or "", "cause not recorded")
            out.append(s.rect(x0, y + h - bh, max(x1 - x0, 0.5), bh,
                              CAUSE_COLOR.get(cause or "", s.ROLE["grid"]),
                              title=f"{steps}: up to {n} waiting, {why}",
                              class_=f"waiting {cause or 'unknown'}"))
        c = end + 1
    out.append(s.text(x - 6, y + 8, str(top), size=8, anchor="end", fill=s.ROLE["grid"]))
    return s.group("".join(out), class_="waiting-strip")


def host_panel_svg(rec: StepRecord, sizes: dict[str, list[tuple[int, int]]], index: int,
                   colors: dict[str, str], x: float, y: float) -> tuple[str, float]:
    """The host pool after rec: each swapped request, its colour and a cell per block; and the
    step's swap-out / swap-in. Returns (svg, height used)."""
    held = [(rid, blocks_of(sizes, rid, index)) for rid in rec.swapped]
    total = sum(n or 0 for _, n in held)
    head = (f"host pool (swapped out): {len(held)} request{'s' * (len(held) != 1)}, "
            f"{total} blocks" if held else "host pool (swapped out): empty")
    out = [s.text(x, y, head, font_weight="bold", class_="host-pool")]
    ty = y
    for rid, n in held[:MAX_HOST_ROWS]:
        ty += 18
        out.append(s.rect(x, ty - 10, 10, 10, colors.get(rid, s.ROLE["grid"])))
        out.append(s.text(x + 14, ty, f"req {rid}", size=10))
        out.append(s.text(x + 74, ty, blocks_text(n).strip(" ()") or "blocks ?", size=9,
                          fill=s.ROLE["grid"]))
        cells = "".join(s.rect(x + 130 + 12 * k, ty - 10, 10, 10, SWAP_ROLE["swapped"],
                               stroke=SWAP_ROLE["swap-out"])
                        for k in range(min(n or 0, 14)))
        more = (n or 0) - 14
        if more > 0:
            cells += s.text(x + 130 + 12 * 14 + 4, ty, f"+{more}", size=9)
        hover = s.title_el(f"req {rid}: {blocks_text(n).strip(' ()') or 'its blocks'} of K/V "
                           "in host memory, copied back when it resumes")
        out.append(s.group(hover + cells, class_="host-request", data_request=rid,
                           data_blocks=n))
    if len(held) > MAX_HOST_ROWS:
        ty += 18
        out.append(s.text(x, ty, f"… and {len(held) - MAX_HOST_ROWS} more requests", size=10))
    moves = swap_moves(rec, "swapped out this step:", "swapped in this step:")
    ty += 16
    out.append(s.text(x, ty, "   ".join(moves) or "no swap this step", size=10,
                      fill=SWAP_ROLE["swap-out"] if moves else s.ROLE["text"],
                      class_="swap-moves"))
    return "".join(out), ty - y
