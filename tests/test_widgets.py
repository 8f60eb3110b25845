"""The widgets (widgets/): SVG builders, BlockTableView, BatchTimeline, the View/widget layer.

Hand-made traces pin what each picture must show (owners, shared and cached blocks, preemption,
fragmentation); a real engine trace with prefix caching and preemption, and a simulated one,
check that the views replay what the engine and the simulator record.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from minillm.trace import ScheduledEntry, StepRecord
from widgets import BatchTimeline, BlockTableView, View
from widgets import svg as s
from widgets.base import slider
from widgets.block_table import infer_block_size, infer_num_blocks, request_colors

NS = "{http://www.w3.org/2000/svg}"


def entry(rid: str, phase: str, num_tokens: int, computed: int) -> ScheduledEntry:
    return ScheduledEntry(rid, phase, num_tokens, computed)  # type: ignore[arg-type]


def hand_trace() -> list[StepRecord]:
    """A and B share a 16-token system prompt (blocks 0, 1; block_size 8, 8 blocks).

    step 0: A prefills 20 tokens; step 1: B prefills 4 after a 16-token prefix hit, A decodes;
    step 2: A is preempted (block 2 stays cached), B decodes; step 3: B finishes.
    """
    return [
        StepRecord(0, 0.0, 1.0, [entry("A", "prefill", 20, 0)], 5, {"A": [0, 1, 2]}),
        StepRecord(1, 1.0, 1.5, [entry("A", "decode", 1, 20), entry("B", "prefill", 4, 16)],
                   4, {"A": [0, 1, 2], "B": [0, 1, 3]}),
        StepRecord(2, 1.5, 1.7, [entry("B", "decode", 1, 20)], 5, {"B": [0, 1, 3]},
                   preempted=["A"], cached_blocks=[2]),
        StepRecord(3, 1.7, 2.0, [entry("B", "decode", 1, 21)], 8, {"B": [0, 1, 3]},
                   finished=["B"], cached_blocks=[2, 0, 1, 3]),
    ]


def parse(svg_text: str) -> ET.Element:
    root = ET.fromstring(svg_text)
    assert root.tag == NS + "svg"
    return root


def titles(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(NS + "title")]


def rects(root: ET.Element, cls: str) -> list[ET.Element]:
    return [r for r in root.iter(NS + "rect") if r.get("class") == cls]


def test_svg_builders_escape_text_and_parse_as_xml() -> None:
    body = (s.hatch("h", "#000") + s.rect(0, 0, 10, 5.5, "url(#h)", title='a<b & "c"',
                                          stroke_width=2)
            + s.text(1, 2, "x < y & z") + s.line(0, 0, 1, 1) + s.polyline([(0, 0), (1.234, 2)])
            + s.circle(1, 1, 1, "#fff", title="dot") + s.legend([("#fff", "free")], 0, 10))
    root = parse(s.svg(100, 50, body, title="T"))
    assert root.get("viewBox") == "0 0 100 50"
    assert 'a<b & "c"' in titles(root)
    assert root.find(f"{NS}rect").get("stroke-width") == "2"
    assert root.find(f"{NS}polyline").get("points") == "0,0 1.23,2"
    assert len(set(s.OWNER_COLORS)) == 7 and s.owner_color(7) == s.owner_color(0)
    assert s.text_color_on(s.PALETTE["blue"]) == "#FFFFFF"
    assert s.text_color_on(s.PALETTE["yellow"]) == s.ROLE["text"]


def test_block_table_counts_owners_shared_cached_and_free_blocks() -> None:
    trace = hand_trace()
    view = BlockTableView(trace, step=1)
    assert (view.num_blocks, view.block_size) == (8, 8)
    snap = view.snapshot()
    states = [snap.state(b) for b in range(8)]
    assert states == ["shared", "shared", "owned", "owned", "free", "free", "free", "free"]
    root = parse(view.to_svg())
    colors = request_colors(trace)
    assert colors["A"] != colors["B"]
    fills = {r.find(NS + "title").text: r.get("fill") for r in root.iter(NS + "rect")
             if r.find(NS + "title") is not None}
    assert fills["block 2: request A"] == colors["A"]
    assert fills["block 3: request B"] == colors["B"]
    shared = fills["block 0: shared by requests A, B (ref count 2)"]
    assert shared == colors["A"]
    assert all(r.get("stroke") == s.ROLE["shared"] for r in rects(root, "block shared"))
    assert len(rects(root, "block shared")) == 2 + 2 * 2  # in the grid and in both tables

    view.step = 2
    snap = view.snapshot()
    assert snap.state(2) == "cached" and snap.state(0) == "owned"
    text = view.to_svg()
    assert "block 2: free, holds a cached prefix" in titles(parse(text))
    assert "preempted: A" in text


def test_block_table_reports_internal_fragmentation() -> None:
    view = BlockTableView(hand_trace(), step=1)
    snap = view.snapshot()
    assert (snap.tokens, snap.slots) == (21 + 20, 8 * 6)  # computed + new, 6 table entries
    assert "41 tokens in 48 slots" in view.to_svg()
    view.step = 3
    assert "finished ✓: B" in view.to_svg()
    assert view.snapshot().num_free_after == 8


def test_inferred_pool_size_and_block_size() -> None:
    trace = hand_trace()
    assert infer_num_blocks(trace) == 8
    assert infer_block_size(trace) == 8
    assert BlockTableView(trace, num_blocks=32).num_blocks == 32


def test_blocks_of_requests_not_scheduled_in_the_step_are_counted_not_placed() -> None:
    rec = StepRecord(0, 0.0, 1.0, [entry("A", "decode", 1, 7)], 5, {"A": [0]})
    view = BlockTableView([rec], num_blocks=8)
    assert view.snapshot().num_unplaced == 2  # 8 blocks - 5 free - 1 of A's
    assert "held, not scheduled: 2" in view.to_svg()


def test_timeline_shows_prefill_decode_preempted_waiting_and_finished() -> None:
    view = BatchTimeline(hand_trace(), budget=24)
    root = parse(view.to_svg())
    hover = titles(root)
    assert "req A, step 0: prefill, 20 tokens" in hover
    assert "req B, step 1: prefill, 4 tokens" in hover
    assert "req A, step 2: preempted, 0 tokens" in hover
    assert "req B, step 3: finished, 1 token" in hover
    assert any(t.startswith("req B, step 2: decode") for t in hover)
    assert rects(root, "cell preempted")[0].get("fill") == s.ROLE["preempted"]
    assert rects(root, "cell finished")[0].get("fill") == s.ROLE["finished"]
    assert "budget 24" in view.to_svg()
    labels = [t.text for t in root.iter(NS + "text")]
    assert "20" in labels  # the prefill chunk's token count, drawn in its cell


def test_timeline_draws_waiting_from_the_arrival_times_given() -> None:
    def waiting_x(view: BatchTimeline) -> float:
        root = parse(view.to_svg())
        bar = [r for r in root.iter(NS + "rect")
               if (t := r.find(NS + "title")) is not None and t.text == "req B: waiting when "
               "not scheduled"]
        return float(bar[0].get("x"))

    assert waiting_x(BatchTimeline(hand_trace())) > waiting_x(
        BatchTimeline(hand_trace(), arrivals={"B": 0.2, "Z": 0.0}))  # B waited through step 0


def test_timeline_aggregates_big_traces_and_places_columns_in_time() -> None:
    trace = [StepRecord(i, i * 0.01, i * 0.01 + 0.005,
                        [entry(str(i // 10 + k), "decode", 1, 50) for k in range(3)], 10, {})
             for i in range(1000)]
    view = BatchTimeline(trace)
    assert (view.num_cols, view.num_rows) == (400, 60)
    text = view.to_svg()
    parse(text)
    assert len(text) < 300_000
    view.x = "time"
    assert view.to_svg() != text
    with pytest.raises(ValueError, match="x must be"):
        view.x = "tokens"


@pytest.mark.parametrize("make", [BlockTableView, BatchTimeline])
def test_step_changes_the_picture_and_state_round_trips(make) -> None:
    view = make(hand_trace(), step=0)
    first = view.to_svg()
    view.set_state({"step": 2})
    assert view.step == 2 and view.to_svg() != first
    view.step = 99
    assert view.step == 3  # clamped to the trace
    bundle = view._repr_mimebundle_()
    assert bundle["text/html"].startswith('<div class="minillm-view"')
    assert f'<div class="mv-picture">{view.to_svg()}</div>' in bundle["text/html"]
    assert bundle["text/plain"].startswith(type(view).__name__)

    widget = view.widget()
    assert widget.values["step"] == 3 and widget.svg == view.to_svg()
    widget.values = {**widget.values, "step": 1}
    assert view.step == 1 and widget.svg == view.to_svg()
    state = widget.get_state()
    other = make(hand_trace(), step=0).widget()
    other.set_state({"values": state["values"]})
    assert other.svg == widget.svg and other.view.get_state() == view.get_state()
    data, _ = widget._repr_mimebundle_()
    assert "<svg" in data["text/html"]
    assert "application/vnd.jupyter.widget-view+json" in data
    with pytest.raises(KeyError, match="no state"):
        view.set_state({"zoom": 2})


def test_view_subclass_contract() -> None:
    class Counter(View):
        count = 0

        def controls(self) -> list[dict]:
            return [slider("count", 0, 9)]

        def to_svg(self) -> str:
            return s.svg(40, 20, s.text(2, 14, self.count))

    view = Counter()
    widget = view.widget()
    widget.set_state({"values": {"count": 4}})
    assert view.count == 4 and ">4</text>" in widget.svg
    assert widget.controls[0]["kind"] == "range"
    assert repr(view) == "Counter(count=4)"


@pytest.fixture(scope="module")
def engine_trace():
    from minillm import LLM, SamplingParams

    llm = LLM(enable_prefix_caching=True, num_kv_blocks=8, block_size=16, device="cpu")
    system = "First Citizen:\nBefore we proceed any further, hear me speak.\n"
    prompts = [system + s for s in ("All:\nSpeak.", "Second Citizen:\nOne", "Men.\nW", "Cor.\nGo")]
    llm.generate(prompts, SamplingParams(max_tokens=16, temperature=0), use_tqdm=False)
    return llm


def test_views_replay_a_real_trace_with_prefix_caching_and_preemption(engine_trace) -> None:
    llm = engine_trace
    trace = llm.trace
    assert llm.stats()["num_preemptions"] > 0
    view = BlockTableView(trace, num_blocks=llm.config.num_kv_blocks)
    assert view.block_size == llm.config.block_size
    pictures, shared_seen = set(), False
    for i in range(len(trace)):
        view.step = i
        pictures.add(view.to_svg())
        parse(view.to_svg())
        shared_seen |= view.snapshot().num_shared > 0
    assert shared_seen and len(pictures) > 1
    timeline = BatchTimeline(trace, budget=llm.config.max_num_batched_tokens)
    root = parse(timeline.to_svg())
    assert rects(root, "cell preempted") and rects(root, "cell finished")
    assert rects(root, "cell prefill") and rects(root, "cell decode")


def test_timeline_replays_a_simulated_trace() -> None:
    from minillm.sim.simulator import simulate
    from minillm.workloads import streams as workload

    work = workload.shared_prefix(12, 20.0, prefix_len=64, num_prefixes=2, suffix_len=(8, 16),
                                  output_len=(4, 12), seed=1)
    sim = simulate("llama-3-8b", "H100-SXM", work, enable_prefix_caching=True)
    arrivals = {o.request_id: o.metrics.arrival_time for o in sim.outputs}
    for x in ("step", "time"):
        root = parse(BatchTimeline(sim.trace, x=x, arrivals=arrivals).to_svg())
        assert len(rects(root, "cell finished")) == 12
    parse(BlockTableView(sim.trace, num_blocks=sim.config.num_kv_blocks, step=3).to_svg())


MOCK_MODEL = """
async (args) => {
  const [esm, state] = args;
  const handlers = {};
  window.saved = [];
  window.model = {
    get: (key) => state[key],
    set: (key, value) => {
      state[key] = value;
      (handlers["change:" + key] || []).forEach((f) => f());
    },
    on: (event, f) => { (handlers[event] = handlers[event] || []).push(f); },
    off: () => {},
    save_changes: () => { window.saved.push({ ...state.values }); },
  };
  const url = URL.createObjectURL(new Blob([esm], { type: "text/javascript" }));
  const widget = (await import(url)).default;
  widget.render({ model: window.model, el: document.getElementById("app") });
}
"""


def chromium_path() -> str:
    import shutil

    pytest.importorskip("playwright.sync_api", reason="Python playwright is not installed")
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.skip("Chromium is absent (install Debian's chromium package to run this test)")
    return path


def test_static_html_and_widget_js_render_in_chromium() -> None:
    """Each view's static HTML, and the widget's ESM driven by a stand-in anywidget model."""
    from io import BytesIO

    from PIL import Image
    from playwright.sync_api import sync_playwright

    from widgets.base import STATIC

    views = [BlockTableView(hand_trace(), step=1), BatchTimeline(hand_trace(), budget=24)]
    static = "".join(v._repr_mimebundle_()["text/html"] for v in views)
    widget = BlockTableView(hand_trace(), step=0).widget()
    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=["--no-sandbox"])
        page = browser.new_page()
        page.route("**/*", lambda route: route.abort())  # no network at all
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.set_content(f"<html><body>{static}<div id='app'></div></body></html>")
        state = {"svg": widget.svg, "controls": widget.controls, "values": widget.values}
        page.evaluate(MOCK_MODEL, [(STATIC / "view.js").read_text(), state])
        assert page.locator("svg").count() == 3
        page.locator("#app input[type=range]").fill("2")  # the user moves the step slider
        saved = page.evaluate("window.saved")
        assert saved[-1]["step"] == 2
        widget.values = saved[-1]  # what the kernel does with the change
        page.evaluate("svg => window.model.set('svg', svg)", widget.svg)
        assert "KV blocks at step 2" in page.inner_html("#app")
        page.locator("#app button").click()  # play: the slider steps on to the last step
        page.wait_for_function("window.saved.length && window.saved.at(-1).step === 3")
        png = page.screenshot(full_page=True)
        browser.close()
    assert errors == []
    histogram = Image.open(BytesIO(png)).convert("L").histogram()
    assert sum(histogram[:200]) > 2000  # the pictures are drawn, not blank
