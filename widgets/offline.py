"""A view on a page with no kernel: its own pictures of a few states, and a small script.

Where no Python runs (the documentation site, a notebook opened without its kernel), a view's
output still holds the picture of its state. To keep its controls working there, the output
also carries the pictures of a set of states, each drawn by the view's own ``to_svg`` (one
source of truth: the page only ever shows Python's drawings, never a redrawing in JavaScript),
and an inline script (``static/offline.js``: no CDN, no require.js, no kernel) that builds the
controls and swaps in the picture of the state they select. Where scripts do not run
(GitHub's notebook viewer, nbval), the picture of the current state is all that shows.

Which states: ``View.offline_controls()`` names, per control, the values to precompute (a trace
view: the step slider at most MAX_STEPS evenly spaced steps, always including the current one;
a calculator: a handful of values of one or two controls); the states are every combination.
Size: the pictures are split into SVG elements and each distinct element is stored once, a
picture being a list of indices into them, so that the frames of a trace, which differ in a
few elements, cost a fraction of their sum; the whole is gzipped (SVG is repetitive text: about
10x smaller) and base64-encoded, and the script unpacks it with the browser's own
DecompressionStream. A view's payload stays within BUDGET bytes: past it, its largest axis
keeps fewer values until it fits. A browser without DecompressionStream shows the picture.
"""

from __future__ import annotations

import base64
import gzip
import html
import itertools
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from widgets.base import View

SCRIPT = Path(__file__).parent / "static" / "offline.js"
MAX_STEPS = 60  # steps a trace view precomputes: enough to scrub through, ~1 s to draw
BUDGET = 150_000  # bytes of one view's packed payload: a page of ten views adds at most 1.5 MB
ELEMENT = re.compile(r"(?=<)")  # split before every tag: an element's text stays with its tag


def spaced(values: list[Any], keep: Any, count: int) -> list[Any]:
    """At most count of values, evenly spaced, the first, the last and keep among them."""
    if len(values) <= count:
        return list(values)
    picks = {round(i * (len(values) - 1) / (count - 1)) for i in range(count)}
    chosen = [values[i] for i in sorted(picks)]
    return sorted(set(chosen) | {keep}, key=values.index)


def with_value(values: list[Any], current: Any) -> list[Any]:
    """values with current among them, in order (a calculator's offline slider stops)."""
    return sorted(set(values) | {current})


def encode(frames: list[str]) -> tuple[list[str], list[list[int]]]:
    """(pieces, indices): every distinct element of the frames once, and each frame as the
    indices of its elements, so that "".join(pieces[i] for i in frame) is the frame."""
    index: dict[str, int] = {}
    pieces: list[str] = []
    encoded = []
    for frame in frames:
        row = []
        for piece in ELEMENT.split(frame):
            if piece not in index:
                index[piece] = len(pieces)
                pieces.append(piece)
            row.append(index[piece])
        encoded.append(row)
    return pieces, encoded


def decode(pieces: list[str], frame: list[int]) -> str:
    """One frame back from encode's output (the script does the same)."""
    return "".join(pieces[i] for i in frame)


def pack(data: dict[str, Any]) -> str:
    """JSON, gzipped, in base64: what the page carries."""
    raw = json.dumps(data, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, 9, mtime=0)).decode("ascii")


def unpack(text: str) -> dict[str, Any]:
    """pack's inverse (the script does the same in the browser)."""
    return json.loads(gzip.decompress(base64.b64decode(text)))


def payload(view: View, budget: int = BUDGET) -> tuple[dict[str, Any], str]:
    """What the page needs to replay view, and its packed form: its offline controls with the
    values of each, and the picture of every combination. The view's state is restored."""
    axes = view.offline_controls()
    original = view.get_state()
    try:
        while True:
            data = _frames(view, axes, original)
            packed = pack(data)
            widest = max(axes, key=lambda a: len(a[1]), default=None)
            if len(packed) <= budget or widest is None or len(widest[1]) <= 2:
                return data, packed
            control, values = widest  # halve the largest axis and try again
            axes = [(c, spaced(v, original[c["name"]], max(len(v) // 2, 2)) if c is control else v)
                    for c, v in axes]
    finally:
        view.set_state(original)


def _frames(view: View, axes: list[tuple[dict[str, Any], list[Any]]],
            original: dict[str, Any]) -> dict[str, Any]:
    frames, states = [], []
    for values in itertools.product(*(v for _, v in axes)):
        state = {c["name"]: value for (c, _), value in zip(axes, values)}
        view.set_state({**original, **state})
        frames.append(view.to_svg())
        states.append(state)
    pieces, encoded = encode(frames)
    current = {c["name"]: original[c["name"]] for c, _ in axes}
    return {"controls": [{**c, "values": v} for c, v in axes], "pieces": pieces,
            "frames": encoded, "initial": states.index(current) if current in states else 0}


def offline_html(view: View) -> str:
    """The view's output: the picture of its state, its payload and the script that replays it
    (only the picture where the view has nothing to replay)."""
    picture = f'<div class="mv-picture">{view.to_svg()}</div>'
    if not view.offline_controls():
        return f'<div class="minillm-view">{picture}</div>'
    _, packed = payload(view)  # base64: nothing in it can close the script element
    name = html.escape(type(view).__name__)
    return (f'<div class="minillm-view" data-view="{name}">{picture}'
            f'<script type="application/octet-stream" class="mv-data">{packed}</script>'
            f"<script>{SCRIPT.read_text()}</script></div>")
