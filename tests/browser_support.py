"""What the real-browser tests share: finding Debian's Chromium, a static file server on
loopback, a page that blocks every request leaving the machine, and the check that a
screenshot is not blank."""

from __future__ import annotations

import contextlib
import functools
import shutil
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHOTS = Path("/tmp/widget-shots")  # copies of the screenshots, for a person to look at
LOOPBACK = {"127.0.0.1", "localhost", "[::1]", "::1"}


def find_chromium() -> str | None:
    """Debian's chromium binary. The /usr/bin/chromium wrapper adds the flags of
    /etc/chromium.d (e.g. --enable-gpu-rasterization), under which headless screenshots can
    hang in a container, so the real binary behind it comes first."""
    real = Path("/usr/lib/chromium/chromium")
    if real.is_file():
        return str(real)
    return shutil.which("chromium") or shutil.which("chromium-browser")


def check_painted(png: Path, name: str) -> None:
    """The screenshot is not blank: enough non-white pixels, in more than a few colours; a copy
    goes to SHOTS."""
    from PIL import Image

    image = Image.open(png).convert("RGB")
    total = image.width * image.height
    counts = {color: n for n, color in image.getcolors(maxcolors=total)}
    painted = total - counts.get((255, 255, 255), 0)
    assert painted > 0.02 * total, f"{name}: only {painted} of {total} pixels are not white"
    assert len(counts) > 4, f"{name}: the picture has only {len(counts)} colours"
    SHOTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(png, SHOTS / f"{name}.png")


def require_browser() -> str:
    """Skip the calling test module unless playwright, Pillow and Debian's Chromium are all
    here; returns Chromium's path. Call it at module level, before importing playwright."""
    import pytest

    pytest.importorskip("playwright.sync_api", reason="needs playwright (pip install playwright)")
    pytest.importorskip("PIL.Image", reason="needs Pillow to check the screenshots")
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; never "
                    "`playwright install`)", allow_module_level=True)
    return chromium


@contextlib.contextmanager
def headless_chromium() -> Iterator[object]:
    """Debian's Chromium, headless, driven by playwright (never `playwright install`)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=find_chromium(), args=["--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


class QuietHandler(SimpleHTTPRequestHandler):
    """A static file server that does not log each request to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """Serve root on 127.0.0.1 (module scripts do not load from file://); yields its URL."""
    handler = functools.partial(QuietHandler, directory=str(root))
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def offline_page(browser: object, width: int = 1000,
                 height: int = 800) -> Iterator[tuple[object, list[str], list[str]]]:
    """A page that aborts every request not to file:// or loopback: (page, console errors,
    blocked URLs)."""
    context = browser.new_context(viewport={"width": width, "height": height})
    page = context.new_page()
    page.set_default_timeout(15_000)
    errors: list[str] = []
    blocked: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def gate(route: object) -> None:
        url = urllib.parse.urlsplit(route.request.url)
        if url.scheme == "file" or url.hostname in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    page.route("**/*", gate)
    try:
        yield page, errors, blocked
    finally:
        context.close()
