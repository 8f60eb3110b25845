"""The documentation site in a real browser, offline.

`jupyter-book build chapters/` writes chapters/_build/html (CI builds it before the tests).
Each page of the table of contents is served on loopback and opened in headless Chromium with
every request leaving the machine blocked: no console errors, and each chapter shows its
figures (matplotlib images that loaded, the widgets' inline SVG pictures) and a Binder launch
link. The course pages (learning path, notation, glossary, instructor guide, solutions policy)
open without errors, the glossary has an anchor for every term, and the term links of the
chapters and pages land on one. Skips when the site has not been built, unless MINILLM_SITE
names the built site (as .ci/run does), in which case a missing site fails.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from browser_support import check_painted, offline_page
from site_support import BOOK, CHAPTERS, SITE, chromium, require_site, served_site  # noqa: F401

COURSE_PAGES = ["learning_path", "notation", "glossary", "instructor_guide", "solutions",
                "appendix_engines"]

require_site()



def test_the_toc_lists_every_chapter_notebook() -> None:
    notebooks = sorted(p.stem for p in BOOK.glob("[0-9][0-9]_*.ipynb"))
    assert CHAPTERS == notebooks, "chapters/_toc.yml and the chapter notebooks disagree"


@pytest.mark.parametrize("chapter", CHAPTERS)
def test_chapter_page_shows_its_figures_offline(chapter: str, url: str, browser: object,
                                               tmp_path: Path) -> None:
    with offline_page(browser, width=1200, height=900) as (page, errors, blocked):
        page.goto(f"{url}/{chapter}.html", wait_until="load")
        images = page.locator(".cell_output img")  # matplotlib figures
        pictures = page.locator(".cell_output .text_html svg")
        assert images.count() + pictures.count() >= 1, f"{chapter}: no plot or widget picture"
        for i in range(images.count()):
            img = images.nth(i)
            img.scroll_into_view_if_needed()
            loaded = img.evaluate("el => el.complete && el.naturalWidth > 0")
            assert loaded, f"{chapter}: image {img.get_attribute('src')} did not load"
        for i in range(pictures.count()):
            box = pictures.nth(i).bounding_box()
            assert box and box["width"] > 100 and box["height"] > 50, (
                f"{chapter}: widget picture {i} is not shown ({box})")
        assert page.locator('a[href*="mybinder.org"]').count() >= 1, f"{chapter}: no Binder link"
        assert page.locator("nav a", has_text="Paged").count() >= 1, "no chapter navigation"
        if chapter == CHAPTERS[1]:  # one page's picture is kept as the test's artifact
            shot = tmp_path / "page.png"
            page.evaluate("window.scrollTo(0, 0)")
            page.screenshot(path=str(shot), full_page=False)
            check_painted(shot, f"site_{chapter}")
        assert errors == [], f"{chapter}: console errors {errors}"
        assert blocked == [], f"{chapter}: requests left the machine: {blocked}"


def test_landing_page_references_and_search_work_offline(url: str, browser: object) -> None:
    with offline_page(browser) as (page, errors, blocked):
        page.goto(f"{url}/intro.html", wait_until="load")
        assert page.locator("img[src*='launch-binder']").evaluate("el => el.naturalWidth > 0")
        for chapter in CHAPTERS:
            assert page.locator(f"article a[href^='{chapter}']").count() >= 1, chapter
        page.goto(f"{url}/references.html", wait_until="load")
        assert page.get_by_text("PagedAttention").count() >= 1, "the bibliography is missing"
        page.goto(f"{url}/search.html?q=prefill", wait_until="load")
        hits = page.locator("#search-results li")
        hits.first.wait_for()
        assert hits.count() >= 2, "searching 'prefill' should find several pages"
        assert errors == [] and blocked == [], (errors, blocked)


@pytest.mark.parametrize("name", COURSE_PAGES)
def test_course_page_opens_offline(name: str, url: str, browser: object) -> None:
    with offline_page(browser) as (page, errors, blocked):
        page.goto(f"{url}/{name}.html", wait_until="load")
        assert page.locator("article h1").count() == 1, f"{name}: no title"
        assert page.locator("article table, article dl.glossary, article pre").count() >= 1, (
            f"{name}: its tables, the glossary's list or its commands are missing")
        assert page.locator("nav a", has_text="Paged").count() >= 1, "no chapter navigation"
        assert errors == [], f"{name}: console errors {errors}"
        assert blocked == [], f"{name}: requests left the machine: {blocked}"
    intro = (SITE / "intro.html").read_text()
    assert f'href="{name}.html' in intro, f"the landing page does not link {name}"


def test_every_term_link_lands_on_a_glossary_entry(url: str, browser: object) -> None:
    """The glossary's anchors exist, one per term, and every {term} link of the site (from the
    chapters if they have any, else from the notation page) lands on one in a browser."""
    glossary = (SITE / "glossary.html").read_text()
    anchors = set(re.findall(r'<dt id="(term-[^"]+)"', glossary))
    assert len(anchors) >= 30, f"the glossary has {len(anchors)} term anchors"
    for term in ["TTFT", "TPOT", "ITL", "KV-cache", "ridge-point", "slot-mapping", "goodput"]:
        assert f"term-{term}" in anchors, f"no glossary anchor for {term}"
    links: dict[str, set[str]] = {}
    for html in SITE.glob("*.html"):
        for anchor in re.findall(r'href="glossary\.html#(term-[^"]+)"', html.read_text()):
            links.setdefault(html.stem, set()).add(anchor)
    dangling = {page: sorted(a - anchors) for page, a in links.items() if a - anchors}
    assert not dangling, f"term links without a glossary entry: {dangling}"
    from_chapters = [page for page in CHAPTERS if page in links]
    source = from_chapters[0] if from_chapters else "notation"
    with offline_page(browser) as (page, errors, blocked):
        page.goto(f"{url}/{source}.html", wait_until="load")
        link = page.locator("article a[href*='glossary.html#term-']").first
        anchor = link.get_attribute("href").split("#", 1)[1]
        link.click()
        page.wait_for_url(f"**/glossary.html#{anchor}")
        entry = page.locator(f"[id='{anchor}']")
        assert entry.count() == 1 and entry.is_visible(), f"{source}: {anchor} did not resolve"
        assert errors == [] and blocked == [], (errors, blocked)
