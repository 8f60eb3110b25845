"""The trace views under memory pressure: swapped requests and why requests wait.

A hand-made trace pins what BatchTimeline and BlockTableView must draw for a swap-out, the span
in host memory, a swap-in, a recompute preemption and the waiting causes; a real engine run
with preemption_mode="swap" and a simulated one check that the views replay what the engine
and the simulator record; an old-style trace (no swap or waiting fields) still renders with
none of it.
"""

from __future__ import annotations

import dataclasses
import random
import xml.etree.ElementTree as ET

import pytest

from minillm.trace import ScheduledEntry, StepRecord
from widgets import BatchTimeline, BlockTableView
from widgets.pressure import blocks_of, has_swaps, step_summary, swap_sizes

NS = "{http://www.w3.org/2000/svg}"


def entry(rid: str, phase: str, num_tokens: int, computed: int) -> ScheduledEntry:
    return ScheduledEntry(rid, phase, num_tokens, computed)  # type: ignore[arg-type]


def swap_trace() -> list[StepRecord]:
    """8 blocks of 8 tokens. step 0: A (20 tokens) and B (10) prefill, C waits for blocks;
    step 1: A is swapped out (3 blocks), C prefills; step 2: B is preempted for recompute;
    step 3: A is swapped back in, C finishes, B waits for a seat; step 4: B prefills again,
    A finishes."""
    return [
        StepRecord(0, 0.0, 1.0, [entry("A", "prefill", 20, 0), entry("B", "prefill", 10, 0)],
                   3, {"A": [0, 1, 2], "B": [3, 4]}, num_waiting=1, waiting_cause="blocks"),
        StepRecord(1, 1.0, 1.2, [entry("B", "decode", 1, 10), entry("C", "prefill", 12, 0)],
                   4, {"B": [3, 4], "C": [0, 1]}, preempted=["A"], swapped_out=["A"],
                   swap_out_blocks=3, swapped=["A"], num_waiting=1, waiting_cause="blocks"),
        StepRecord(2, 1.2, 1.4, [entry("C", "decode", 1, 12)], 6, {"C": [0, 1]},
                   preempted=["B"], swapped=["A"], num_waiting=2, waiting_cause="blocks"),
        StepRecord(3, 1.4, 1.6, [entry("A", "decode", 1, 20), entry("C", "decode", 1, 13)],
                   5, {"A": [2, 3, 4], "C": [0, 1]}, finished=["C"], swapped_in=["A"],
                   swap_in_blocks=3, num_waiting=1, waiting_cause="seats"),
        StepRecord(4, 1.6, 1.8, [entry("A", "decode", 1, 21), entry("B", "prefill", 11, 0)],
                   6, {"A": [2, 3, 4], "B": [0, 1]}, finished=["A"]),
    ]


def parse(svg_text: str) -> ET.Element:
    root = ET.fromstring(svg_text)
    assert root.tag == NS + "svg"
    return root


def titled(root: ET.Element, cls: str) -> list[str]:
    """The hover texts of the elements of class cls."""
    return [(el.findtext(NS + "title") or "") for el in root.iter() if el.get("class") == cls]


def texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(NS + "text")]


def host_requests(root: ET.Element) -> dict[str, str]:
    """The host pool panel's requests: id -> the block count it shows."""
    return {g.get("data-request"): g.get("data-blocks") for g in root.iter(NS + "g")
            if g.get("class") == "host-request"}


def test_timeline_tells_swap_from_recompute_and_draws_the_span_in_host_memory() -> None:
    root = parse(BatchTimeline(swap_trace(), step=1, budget=32).to_svg())
    assert titled(root, "cell swap-out") == ["req A, step 1: swap-out, 0 tokens"]
    assert titled(root, "cell swap-in") == ["req A, step 3: swap-in, 1 token"]
    assert titled(root, "cell preempted") == ["req B, step 2: preempted, 0 tokens"]
    assert titled(root, "swapped") == [
        "req A, step 1 to step 2: swapped out, K/V in host memory (3 blocks)"]
    legend = texts(root)
    assert {"swap out", "K/V in host memory", "swap in", "preempted (recompute)",
            "wait: blocks", "wait: seats"} <= set(legend)
    summary = [el.text for el in root.iter(NS + "text") if el.get("class") == "step-summary"]
    assert summary == ["step 1: swapped out req A (3 blocks → host) · 1 in host pool (3 blocks)"
                       " · 1 waiting: no free KV blocks"]


def test_timeline_strip_counts_waiting_requests_by_cause() -> None:
    view = BatchTimeline(swap_trace())
    root = parse(view.to_svg())
    assert titled(root, "waiting blocks") == [  # equal neighbours share a bar
        "step 0 to step 1: up to 1 waiting, no free KV blocks",
        "step 2: up to 2 waiting, no free KV blocks"]
    assert titled(root, "waiting seats") == [
        "step 3: up to 1 waiting, no free seat (max_num_seqs)"]
    view.step = 3
    marker = next(g for g in parse(view.to_svg()).iter(NS + "g")
                  if g.find(NS + "line") is not None and g.find(NS + "line").get("class")
                  == "marker")
    assert marker.findtext(NS + "title") == (
        "step 3: 2 tokens; swapped in req A (3 blocks ← host); 1 waiting: no free seat "
        "(max_num_seqs)")


def test_block_table_lists_the_host_pool_and_the_steps_swaps() -> None:
    view = BlockTableView(swap_trace(), step=1)
    assert (view.num_blocks, view.block_size) == (8, 8)
    root = parse(view.to_svg())
    assert host_requests(root) == {"A": "3"}
    shown = texts(root)
    assert "host pool (swapped out): 1 request, 3 blocks" in shown
    assert "swapped out this step: A (3 blocks → host)" in shown
    assert "waiting after step: 1 · admission stopped by: no free KV blocks" in shown
    view.step = 2
    root = parse(view.to_svg())
    assert host_requests(root) == {"A": "3"}
    assert any(t.startswith("preempted (recompute): B") for t in texts(root))
    view.step = 3
    root = parse(view.to_svg())
    assert host_requests(root) == {}
    assert "host pool (swapped out): empty" in texts(root)
    assert "swapped in this step: A (3 blocks ← host)" in texts(root)


def test_block_counts_of_a_step_that_swaps_several_requests() -> None:
    """The step's total does not say who moved what: each request's last table does, and
    without traced tables its tokens do (ceil(tokens / block_size))."""
    trace = [
        StepRecord(0, 0.0, 1.0, [entry("A", "prefill", 20, 0), entry("B", "prefill", 9, 0)],
                   3, {"A": [0, 1, 2], "B": [3, 4]}),
        StepRecord(1, 1.0, 2.0, [], 8, {}, preempted=["A", "B"], swapped_out=["A", "B"],
                   swap_out_blocks=5, swapped=["A", "B"]),
    ]
    assert swap_sizes(trace, 8) == {"A": [(1, 3)], "B": [(1, 2)]}
    bare = [dataclasses.replace(rec, block_tables={}) for rec in trace]
    assert swap_sizes(bare, 8) == swap_sizes(trace, 8)
    assert blocks_of(swap_sizes(trace, 8), "A", 0) is None
    root = parse(BlockTableView(trace, step=1, num_blocks=8, block_size=8).to_svg())
    assert host_requests(root) == {"A": "3", "B": "2"}


def test_an_old_trace_renders_with_no_swap_or_waiting_marks() -> None:
    """Traces written before these fields existed leave them at their defaults."""
    old = [dataclasses.replace(rec, swapped_out=[], swapped_in=[], swap_out_blocks=0,
                               swap_in_blocks=0, swapped=[], num_waiting=0, waiting_cause=None)
           for rec in swap_trace()]
    assert not has_swaps(old) and step_summary(old[0], {}, 0) == ""
    assert step_summary(old[1], {}, 1) == "preempted for recompute: req A"  # all there was
    timeline = parse(BatchTimeline(old, budget=32).to_svg())
    assert titled(timeline, "cell preempted") == ["req A, step 1: preempted, 0 tokens",
                                                  "req B, step 2: preempted, 0 tokens"]
    assert not titled(timeline, "swapped") and not titled(timeline, "cell swap-out")
    assert not [g for g in timeline.iter(NS + "g") if g.get("class") == "waiting-strip"]
    assert "swap out" not in texts(timeline) and "preempted" in texts(timeline)
    table = parse(BlockTableView(old, step=1).to_svg())
    assert host_requests(table) == {}
    assert not any(t.startswith("host pool") or t.startswith("waiting after")
                   for t in texts(table))
    assert any(t.startswith("preempted: A") for t in texts(table))


@pytest.fixture(scope="module")
def swap_llm():
    from minillm import LLM, SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randrange(4096) for _ in range(rng.randint(5, 60))] for _ in range(12)]
    llm = LLM(num_kv_blocks=14, max_num_batched_tokens=64, preemption_mode="swap", device="cpu")
    llm.generate(prompts, [SamplingParams(max_tokens=40, ignore_eos=True)] * 12, use_tqdm=False)
    return llm


def test_views_replay_the_swaps_of_a_real_engine_run(swap_llm) -> None:
    llm, trace = swap_llm, swap_llm.trace
    stats = llm.stats()
    assert stats["num_swap_outs"] >= 4 and stats["num_recomputed_tokens"] == 0
    timeline = parse(BatchTimeline(trace, budget=llm.config.max_num_batched_tokens).to_svg())
    outs = [(rid, rec.step) for rec in trace for rid in rec.swapped_out]
    ins = [(rid, rec.step) for rec in trace for rid in rec.swapped_in]
    assert len(outs) == len(ins) == stats["num_swap_outs"]
    drawn_out = titled(timeline, "cell swap-out")
    assert sorted(drawn_out) == sorted(f"req {r}, step {s}: swap-out, 0 tokens" for r, s in outs)
    assert len(titled(timeline, "cell swap-in")) == len(ins)
    assert len(titled(timeline, "swapped")) == len(outs)  # one span per stay in the pool
    assert not titled(timeline, "cell preempted")  # the host pool never filled: no recompute
    assert titled(timeline, "waiting blocks")

    view = BlockTableView(trace, num_blocks=llm.config.num_kv_blocks)
    block_bytes = stats["swap_out_bytes"] // sum(rec.swap_out_blocks for rec in trace)
    for i, rec in enumerate(trace):
        if not (rec.swapped or rec.swapped_in):
            continue
        view.step = i
        shown = host_requests(parse(view.to_svg()))
        assert set(shown) == set(rec.swapped)
        if len(rec.swapped_out) == 1:
            assert shown[rec.swapped_out[0]] == str(rec.swap_out_blocks)
    # the blocks that went out are the blocks that came back
    assert sum(rec.swap_in_blocks for rec in trace) * block_bytes == stats["swap_in_bytes"]


@pytest.mark.parametrize("num_requests", [40, 90])  # 90: more requests than rows, aggregated
def test_views_replay_a_simulated_run_with_swaps(num_requests: int) -> None:
    from minillm.sim.simulator import simulate
    from minillm.workloads import streams as workload

    work = workload.poisson(num_requests, 200.0, prompt_len=(200, 600), output_len=(50, 200),
                            seed=1)
    sim = simulate("llama-3-8b", "H100-SXM", work, num_kv_blocks=200, preemption_mode="swap")
    assert sim.stats["num_swap_outs"] > 0
    for x in ("step", "time"):
        root = parse(BatchTimeline(sim.trace, x=x).to_svg())
        assert titled(root, "cell swap-out") and titled(root, "swapped")
        assert titled(root, "waiting blocks")
    i = next(i for i, rec in enumerate(sim.trace) if len(rec.swapped_out) == 1)
    rec = sim.trace[i]
    view = BlockTableView(sim.trace, step=i, num_blocks=sim.config.num_kv_blocks,
                          block_size=sim.config.block_size)
    shown = host_requests(parse(view.to_svg()))
    assert set(shown) == set(rec.swapped)
    assert shown[rec.swapped_out[0]] == str(rec.swap_out_blocks)
    assert "host pool" in view.widget().svg
