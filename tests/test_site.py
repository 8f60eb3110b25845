"""The documentation site in a real browser, offline.

`jupyter-book build chapters/` writes chapters/_build/html (CI builds it before the tests).
Each page of the table of contents is served on loopback and opened in headless Chromium with
every request leaving the machine blocked: no console errors, and each chapter shows its
figures (matplotlib images that loaded, the widgets' inline SVG pictures) and a Binder launch
link. Skips when the site has not been built, unless MINILLM_SITE names the built site (as
.ci/run does), in which case a missing site fails.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import (  # noqa: E402
    check_painted,
    headless_chromium,
    offline_page,
    require_browser,
    serve_directory,
)

BOOK = Path(__file__).resolve().parents[1] / "chapters"
SITE = Path(os.environ.get("MINILLM_SITE") or BOOK / "_build" / "html")
CHAPTERS = re.findall(r"file:\s*(\d\d_\w+)", (BOOK / "_toc.yml").read_text())

if not (SITE / "intro.html").is_file():
    if os.environ.get("MINILLM_SITE"):
        raise FileNotFoundError(f"MINILLM_SITE={SITE} holds no built site (intro.html)")
    pytest.skip("the site is not built: pip install -e '.[book,docs]' && jupyter-book build "
                "chapters/", allow_module_level=True)
require_browser()


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_directory(SITE) as base:
        yield base


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium for the module."""
    with headless_chromium() as chromium:
        yield chromium


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
