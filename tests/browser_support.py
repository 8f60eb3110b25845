"""What the real-browser tests share: finding Debian's Chromium, the loopback-only rule, and
the check that a screenshot is not blank."""

from __future__ import annotations

import shutil
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
