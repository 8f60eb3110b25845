"""Views stay interactive without a kernel (widgets.offline): the output carries Python's own
pictures of a set of states and a script that replays them. The packed frames decode to exactly
what to_svg draws for each state, the payload keeps to its budget, and in a real browser, with
the network off, moving a control shows the picture Python draws for the state it selects."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from minillm import simulate
from minillm.workloads import streams as workload
from widgets import (
    BatchTimeline,
    BlockTableView,
    KVCalculator,
    RooflineExplorer,
    SLOView,
    TilingView,
    offline,
)
from widgets.slo_view import SweepPoint


@pytest.fixture(scope="module")
def trace() -> list:
    work = workload.poisson(40, 20.0, (50, 400), (20, 80), seed=1)
    return simulate("llama-3-8b", "H100-SXM", work, num_kv_blocks=256, block_size=16,
                    max_num_seqs=12).trace


def slo_view(trace: list) -> SLOView:
    """An SLOView over a two-workload sweep simulated at three rates each."""
    sweeps = {}
    for name, prompt in (("short", 64), ("long", 1024)):
        points = []
        for rate in (10.0, 40.0, 160.0):
            r = simulate("llama-3.2-1b", "H100-SXM", workload.poisson(60, rate, prompt, 32, seed=2),
                         max_num_seqs=32, record_block_tables=False)
            points.append(SweepPoint.of(rate, (o.metrics for o in r.outputs),
                                        r.summary().duration))
        sweeps[name] = points
    return SLOView(sweeps, ttft_ms=200, tpot_ms=20)


def frames_of(view) -> tuple[dict, list[dict]]:
    """The payload and each frame's state, in frame order (itertools.product's)."""
    import itertools

    data, _ = offline.payload(view)
    names = [c["name"] for c in data["controls"]]
    states = [dict(zip(names, values))
              for values in itertools.product(*(c["values"] for c in data["controls"]))]
    return data, states


def test_spaced_keeps_the_ends_and_the_current_value() -> None:
    values = list(range(100))
    picked = offline.spaced(values, 37, 5)
    assert picked[0] == 0 and picked[-1] == 99 and 37 in picked and len(picked) <= 6
    assert picked == sorted(picked)
    assert offline.spaced([1, 2, 3], 2, 10) == [1, 2, 3]


def test_encoding_round_trips() -> None:
    frames = ['<svg><rect x="1"/><text>a</text></svg>', '<svg><rect x="2"/><text>a</text></svg>']
    pieces, encoded = offline.encode(frames)
    assert [offline.decode(pieces, f) for f in encoded] == frames
    assert len(pieces) < sum(len(offline.ELEMENT.split(f)) for f in frames)  # shared once
    assert offline.unpack(offline.pack({"a": [1, "</script>"]})) == {"a": [1, "</script>"]}


@pytest.mark.parametrize("make", [
    lambda t: BatchTimeline(t, budget=2048),
    lambda t: BlockTableView(t, step=len(t) // 2, num_blocks=256, block_size=16),
    lambda t: KVCalculator("llama-3-8b", context_len=8192, batch=64),
    lambda t: RooflineExplorer("H100-SXM", "llama-3-8b", batch=8),
    lambda t: TilingView(1024, 1024, step=40),
    slo_view,
], ids=["timeline", "block-table", "kv-calculator", "roofline", "tiling", "slo"])
def test_every_frame_is_what_python_draws_for_its_state(make, trace) -> None:
    view = make(trace)
    before = view.get_state()
    data, states = frames_of(view)
    assert view.get_state() == before, "building the payload restores the view's state"
    assert len(data["frames"]) == len(states) >= 2
    for index in sorted({0, len(states) // 2, len(states) - 1, data["initial"]}):
        view.set_state({**before, **states[index]})
        assert offline.decode(data["pieces"], data["frames"][index]) == view.to_svg(), index
    view.set_state(before)
    assert states[data["initial"]] == {k: before[k] for k in states[0]}


def test_a_trace_view_keeps_its_step_among_at_most_max_steps(trace) -> None:
    view = BlockTableView(trace, step=7, num_blocks=256, block_size=16)
    data, _ = offline.payload(view)
    steps = data["controls"][0]["values"]
    assert data["controls"][0]["name"] == "step" and 7 in steps
    assert len(steps) <= offline.MAX_STEPS + 1 and steps[-1] == len(trace) - 1


def test_a_payload_over_budget_drops_values_until_it_fits(trace) -> None:
    view = BatchTimeline(trace)
    _, full = offline.payload(view)
    data, packed = offline.payload(view, budget=int(len(full) * 0.8))
    assert len(packed) <= len(full) * 0.8
    assert len(data["controls"][0]["values"]) < offline.MAX_STEPS
    floor, _ = offline.payload(view, budget=1)  # never under two values an axis
    assert [len(c["values"]) for c in floor["controls"]] == [2, 2]


def test_the_html_shows_the_picture_without_scripts(trace) -> None:
    view = BatchTimeline(trace)
    html = view._repr_mimebundle_()["text/html"]
    assert html.startswith('<div class="minillm-view" data-view="BatchTimeline">')
    assert f'<div class="mv-picture">{view.to_svg()}</div>' in html
    packed = re.search(r'class="mv-data">([^<]+)</script>', html).group(1)
    assert offline.unpack(packed)["controls"][0]["name"] == "step"
    assert "http" not in offline.SCRIPT.read_text().replace("http://www.w3.org", ""), "no CDN"


# --- in a browser ------------------------------------------------------------------------------

def page_of(views: list, path: Path) -> Path:
    body = "".join(v._repr_mimebundle_()["text/html"] for v in views)
    path.write_text(f"<!doctype html><html><body><main style='width:900px'>{body}</main>"
                    "</body></html>")
    return path


def test_moving_a_control_shows_pythons_picture_of_that_state(trace, tmp_path: Path) -> None:
    from browser_support import headless_chromium, offline_page, require_browser, serve_directory

    require_browser()
    views = [BatchTimeline(trace, budget=2048),
             BlockTableView(trace, step=3, num_blocks=256, block_size=16),
             KVCalculator("llama-3-8b", context_len=8192, batch=64), TilingView(1024, 1024),
             slo_view(trace)]
    page_of(views, tmp_path / "views.html")
    payloads = [frames_of(v) for v in views]
    with serve_directory(tmp_path) as url, headless_chromium() as browser, \
            offline_page(browser) as (page, errors, blocked):
        page.goto(f"{url}/views.html", wait_until="load")
        boxes = page.locator(".minillm-view")
        assert boxes.count() == len(views)
        page.wait_for_function("[...document.querySelectorAll('.minillm-view')]"
                               ".every(b => b.dataset.ready === '1')")
        for k, (view, (data, states)) in enumerate(zip(views, payloads)):
            box = boxes.nth(k)
            before = box.locator(".mv-picture").inner_html()
            control = data["controls"][0]
            field = box.locator(f"[data-control='{control['name']}']")
            target = len(control["values"]) - 1 if data["initial"] == 0 else 0
            if control["kind"] == "range":
                field.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                               str(target))
            else:
                field.select_option(str(target))
            frame = int(box.get_attribute("data-frame"))
            state = states[frame]
            assert state[control["name"]] == control["values"][target]
            original = view.get_state()
            view.set_state({**original, **state})
            shown = box.evaluate("b => b.mvSource")
            assert shown == view.to_svg(), f"{type(view).__name__}: the page's picture of {state}"
            view.set_state(original)
            assert box.locator(".mv-picture").inner_html() != before, "the picture changed"
            assert box.locator(".mv-picture svg").count() == 1
        assert errors == [] and blocked == [], (errors, blocked)


def test_without_scripts_the_page_shows_the_pictures(trace, tmp_path: Path) -> None:
    """GitHub's notebook viewer and nbval run no scripts: the picture of the current state is
    still there, and no control is."""
    from browser_support import headless_chromium, require_browser, serve_directory

    require_browser()
    views = [BatchTimeline(trace), KVCalculator()]
    page_of(views, tmp_path / "static.html")
    with serve_directory(tmp_path) as url, headless_chromium() as browser:
        context = browser.new_context(java_script_enabled=False)
        page = context.new_page()
        page.goto(f"{url}/static.html", wait_until="load")
        assert page.locator(".mv-picture svg").count() == len(views)
        assert page.locator(".mv-controls").count() == 0
        for k, view in enumerate(views):
            box = page.locator(".mv-picture svg").nth(k).bounding_box()
            assert box and box["width"] > 100, type(view).__name__
        context.close()
