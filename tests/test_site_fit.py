"""The built site's pictures fit the text column, on a laptop and on a phone.

Each chapter page of chapters/_toc.yml is opened offline in headless Chromium at 1280 x 900 and
at 390 x 844 (a phone). The column is the article's content box (``main .bd-article`` less its
padding: 688 px at 1280, 358 px at 390 in Jupyter Book 1's theme). Asserted from element boxes,
allowing 1 px of rounding: no cell output's picture (a view's <svg>, a matplotlib <img>) is
wider than the column or reaches past its right edge; no picture's text runs past its own
viewBox (it would be cut off); no output with a picture scrolls sideways (the theme gives
outputs overflow:auto, so an overflowing picture hides behind a scroll bar rather than widening
the page); and the page itself does not scroll sideways at 390 px. The views' offline
controls (widgets/offline.py) are then moved to their last value, every slider and dropdown of
the page, and the pictures they swap in are measured again (a later step of a trace can draw a
wider picture). A screenshot of each page's widest picture at each width goes to
/tmp/widget-shots for a person to look at.

Skips when the site has not been built, unless MINILLM_SITE names the built site (as .ci/run
does), in which case a missing site fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_support import check_painted, offline_page
from site_support import CHAPTERS, chromium, require_site, served_site  # noqa: F401

VIEWPORTS = {"laptop": (1280, 900), "phone": (390, 844)}
ROUNDING = 1  # px: element boxes are fractional, the column's edges are not always

require_site()

# The boxes the test asserts on, measured in the page: the column, each picture (top-level
# <svg>s of the outputs, not icons inside buttons, and <img>s), the furthest its texts reach
# in its own user units, and the outputs that scroll sideways.
MEASURE = """() => {
  const article = document.querySelector("main .bd-article") || document.querySelector("article");
  const a = article.getBoundingClientRect(), cs = getComputedStyle(article);
  const left = a.left + parseFloat(cs.paddingLeft), right = a.right - parseFloat(cs.paddingRight);
  const pictures = [...document.querySelectorAll(".cell_output svg, .cell_output img")]
    .map((el, index) => [el, index])
    .filter(([el]) => !el.parentElement.closest("svg, button"))
    .map(([el, index]) => {
      const b = el.getBoundingClientRect();
      let textReach = 0, viewWidth = 0;
      if (el.tagName.toLowerCase() === "svg" && el.viewBox.baseVal && el.viewBox.baseVal.width) {
        viewWidth = el.viewBox.baseVal.width;
        for (const t of el.querySelectorAll("text")) {
          if (t.closest("defs") || t.getAttribute("transform")) continue;
          const tb = t.getBBox();
          textReach = Math.max(textReach, tb.x + tb.width);
        }
      }
      return {index, tag: el.tagName.toLowerCase(), left: b.left, right: b.right,
              width: b.width, height: b.height, viewWidth, textReach,
              label: (el.querySelector && el.querySelector("title")
                      ? el.querySelector("title").textContent : el.getAttribute("src") || "")
                     .slice(0, 60)};
    });
  const scrolled = [...document.querySelectorAll(".cell_output > .output")]
    .filter((o) => o.querySelector("svg:not(button svg), img"))
    .filter((o) => o.scrollWidth > o.clientWidth + 1)
    .map((o) => [o.scrollWidth, o.clientWidth]);
  return {left, right, pictures, scrolled, pageWidth: document.documentElement.scrollWidth,
          innerWidth: window.innerWidth};
}"""


# Every offline control in the outputs to its last value: ranges get an input event, dropdowns
# a change event, as a reader's moves would; returns how many controls moved.
MOVE_CONTROLS = """() => {
  const inputs = [...document.querySelectorAll(".cell_output input[type=range]")];
  const selects = [...document.querySelectorAll(".cell_output select")];
  inputs.forEach((el) => { el.value = el.max; el.dispatchEvent(new Event("input")); });
  selects.forEach((el) => {
    el.selectedIndex = el.options.length - 1;
    el.dispatchEvent(new Event("change"));
  });
  return inputs.length + selects.length;
}"""
# The views whose script has built its controls (data-ready="1") and those that carry one.
VIEWS_READY = """() => [document.querySelectorAll(".minillm-view[data-ready='1']").length,
  document.querySelectorAll(".minillm-view script.mv-data").length]"""



def misfits(m: dict) -> list[str]:
    """What does not fit, one line each: pictures wider than the column or past its edges,
    texts past their picture's viewBox, outputs that scroll sideways."""
    column = m["right"] - m["left"]
    out = []
    for p in m["pictures"]:
        if p["width"] == 0:  # not displayed (e.g. a collapsed output)
            continue
        what = f"{p['tag']} {p['index']} ({p['label']!r})"
        if p["width"] > column + ROUNDING or p["right"] > m["right"] + ROUNDING:
            out.append(f"{what} is {p['width']:.0f} px wide, spans x {p['left']:.0f}-"
                       f"{p['right']:.0f}; the column is {column:.0f} px, x {m['left']:.0f}-"
                       f"{m['right']:.0f}")
        if p["viewWidth"] and p["textReach"] > p["viewWidth"] + 2:
            out.append(f"{what}: a text runs to x = {p['textReach']:.0f}, past its viewBox "
                       f"width {p['viewWidth']:.0f} (cut off)")
    out += [f"an output with a picture scrolls sideways: {s} px of content in {c} px"
            for s, c in m["scrolled"]]
    return out


def shoot(page: object, m: dict, name: str, tmp_path: Path) -> None:
    """A screenshot of the viewport around the page's widest picture (or its top)."""
    pictures = [p for p in m["pictures"] if p["width"] > 0]
    if pictures:
        widest = max(pictures, key=lambda p: p["width"])
        el = page.locator(".cell_output svg, .cell_output img").nth(widest["index"])
        el.scroll_into_view_if_needed()
    shot = tmp_path / f"{name}.png"
    page.screenshot(path=str(shot))
    check_painted(shot, name)


@pytest.mark.parametrize("viewport", list(VIEWPORTS))
@pytest.mark.parametrize("chapter", CHAPTERS)
def test_pictures_fit_the_column(chapter: str, viewport: str, url: str, browser: object,
                                 tmp_path: Path) -> None:
    width, height = VIEWPORTS[viewport]
    with offline_page(browser, width=width, height=height) as (page, errors, blocked):
        page.goto(f"{url}/{chapter}.html", wait_until="load")
        page.wait_for_function(f"({VIEWS_READY})().reduce((a, b) => a === b)")
        m = page.evaluate(MEASURE)
        shoot(page, m, f"fit-{chapter}-{viewport}", tmp_path)
        assert m["pictures"], f"{chapter}: no pictures in the outputs"
        bad = misfits(m)
        assert not bad, f"{chapter} at {width} px:\n" + "\n".join(bad)
        if page.evaluate(MOVE_CONTROLS):
            bad = misfits(page.evaluate(MEASURE))
            assert not bad, f"{chapter} at {width} px, controls moved:\n" + "\n".join(bad)
        if viewport == "phone":
            assert m["pageWidth"] <= m["innerWidth"] + ROUNDING, (
                f"{chapter}: the page scrolls sideways at {width} px "
                f"({m['pageWidth']} px of content)")
