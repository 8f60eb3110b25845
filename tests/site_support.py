"""What the tests of the built site share: where it is (MINILLM_SITE, as .ci/run sets it, else
chapters/_build/html), its chapters in table-of-contents order, the module-level skip when it
is not built, and two module fixtures: the site served on loopback (``url``) and one headless
Chromium (``browser``). A test module imports served_site and chromium; pytest finds them in
its globals and offers them under those names."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from browser_support import headless_chromium, require_browser, serve_directory

BOOK = Path(__file__).resolve().parents[1] / "chapters"
SITE = Path(os.environ.get("MINILLM_SITE") or BOOK / "_build" / "html")
CHAPTERS = re.findall(r"file:\s*(\d\d_\w+)", (BOOK / "_toc.yml").read_text())


def require_site() -> None:
    """Skip the calling module when the site is not built (fail if MINILLM_SITE names a
    folder without one), and unless a browser is here. Call it at module level."""
    if not (SITE / "intro.html").is_file():
        if os.environ.get("MINILLM_SITE"):
            raise FileNotFoundError(f"MINILLM_SITE={SITE} holds no built site (intro.html)")
        pytest.skip("the site is not built: pip install -e '.[book,docs]' && jupyter-book "
                    "build chapters/", allow_module_level=True)
    require_browser()


@pytest.fixture(scope="module", name="url")
def served_site() -> Iterator[str]:
    with serve_directory(SITE) as base:
        yield base


@pytest.fixture(scope="module", name="browser")
def chromium() -> Iterator[object]:
    """One headless Chromium for the module."""
    with headless_chromium() as running:
        yield running
