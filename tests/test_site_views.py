"""The site's views replay themselves with no kernel and no network (widgets.offline).

On every chapter page of the built site, in headless Chromium with every request leaving the
machine blocked: each view's script unpacks its states, moving a trace view's step slider and
a calculator's control changes the picture, and the picture shown is, byte for byte, Python's
drawing of that state as the page carries it (tests/test_offline_views.py checks those drawings
against to_svg state by state). No console errors. The weight the views add to each page is
printed and kept under PAGE_BUDGET. Skips like tests/test_site.py when the site is not built.
"""

from __future__ import annotations

import re

import pytest
from browser_support import offline_page
from site_support import CHAPTERS, SITE, chromium, require_site, served_site  # noqa: F401

from widgets import offline

TRACE_VIEWS = ("BatchTimeline", "BlockTableView", "PrefixCacheView", "TilingView")  # step sliders
CALCULATORS = ("RooflineExplorer", "KVCalculator", "SLOView")
PAGE_BUDGET = 2_500_000  # bytes the views of one chapter page may add (see view_bytes)

require_site()

VIEW = re.compile(r'<div class="minillm-view" data-view="(\w+)">.*?'
                  r'<script type="application/octet-stream" class="mv-data">([^<]+)</script>'
                  r"<script>(.*?)</script></div>", re.S)


def view_bytes(html: str) -> dict[str, int]:
    """Bytes the offline views add to a page: their packed states and their scripts (the
    picture of the current state was on the page before)."""
    views = VIEW.findall(html)
    return {"views": len(views), "states": sum(len(p) for _, p, _ in views),
            "scripts": sum(len(s) for _, _, s in views)}




def test_page_weight_of_the_views() -> None:
    rows = []
    for chapter in CHAPTERS:
        weight = view_bytes((SITE / f"{chapter}.html").read_text())
        rows.append((chapter, weight))
        added = weight["states"] + weight["scripts"]
        assert added <= PAGE_BUDGET, f"{chapter}: the views add {added:,} bytes"
    print("\n".join(f"{c}: {w['views']} views, {w['states'] / 1e3:.0f} KB of states, "
                    f"{w['scripts'] / 1e3:.0f} KB of scripts" for c, w in rows))
    assert sum(w["views"] for _, w in rows) >= 10, "the chapters' views carry their states"


def move(box: object, kind: str) -> None:
    """Move the box's first control to another value: the last, or the first if it is there."""
    field = box.locator("[data-control]").first
    if kind == "range":
        top = int(field.get_attribute("max"))
        target = 0 if int(field.input_value()) == top else top
        field.evaluate("(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }",
                       str(target))
    else:
        count = field.locator("option").count()
        target = 0 if int(field.input_value()) == count - 1 else count - 1
        field.select_option(str(target))


@pytest.mark.parametrize("chapter", [c for c in CHAPTERS
                                     if VIEW.search((SITE / f"{c}.html").read_text())])
def test_views_replay_offline(chapter: str, url: str, browser: object) -> None:
    html = (SITE / f"{chapter}.html").read_text()
    packed = [(name, offline.unpack(p)) for name, p, _ in VIEW.findall(html)]
    with offline_page(browser, width=1280, height=900) as (page, errors, blocked):
        page.goto(f"{url}/{chapter}.html", wait_until="load")
        page.wait_for_function("[...document.querySelectorAll('.minillm-view[data-view]')]"
                               ".every(b => b.dataset.ready === '1')")
        boxes = page.locator(".minillm-view[data-view]")
        assert boxes.count() == len(packed)
        moved = set()
        for k, (name, data) in enumerate(packed):
            kind = "trace" if name in TRACE_VIEWS else "calculator" if name in CALCULATORS else None
            if kind is None or kind in moved:
                continue
            box = boxes.nth(k)
            box.scroll_into_view_if_needed()
            before = box.locator(".mv-picture").inner_html()
            move(box, data["controls"][0]["kind"])
            frame = int(box.get_attribute("data-frame"))
            shown = box.evaluate("b => b.mvSource")
            assert shown == offline.decode(data["pieces"], data["frames"][frame]), (
                f"{chapter}: {name} shows another picture than Python drew for frame {frame}")
            assert box.locator(".mv-picture").inner_html() != before, f"{chapter}: {name}"
            moved.add(kind)
        assert moved, f"{chapter}: no trace view or calculator to move"
        assert errors == [], f"{chapter}: console errors {errors}"
        assert blocked == [], f"{chapter}: requests left the machine: {blocked}"
