"""The views in a real browser: headless Chromium (Debian's package) driven by playwright.

Each view's static HTML (what the site, GitHub and nbval show) must load with no console
errors and no request leaving the machine, hold an <svg>, and paint something. The
interactive layer (widgets/static/view.js, anywidget's ESM) is loaded as a module and driven
through a stand-in for anywidget's model whose save_changes calls the real Python ViewWidget,
so a moved control re-renders the picture end to end. ipywidgets' embed manager
(embed_minimal_html) is not tested: it loads @jupyter-widgets/html-manager and require.js from
a CDN, so it cannot work offline. Screenshots go to a temp dir and, one per view, to
/tmp/widget-shots/. Skips where playwright or chromium is missing (pip install playwright;
apt-get install chromium: never `playwright install`, which downloads a browser).
"""

from __future__ import annotations

import html
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")

from browser_support import (  # noqa: E402
    check_painted,
    headless_chromium,
    offline_page,
    require_browser,
    serve_directory,
)

from widgets.base import STATIC, View  # noqa: E402

require_browser()


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """One headless Chromium for the module."""
    with headless_chromium() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """A folder with the widgets' JS and CSS, served on 127.0.0.1: (dir, url)."""
    root = tmp_path_factory.mktemp("site")
    for name in ("view.js", "view.css"):
        shutil.copy(STATIC / name, root / name)
    with serve_directory(root) as url:
        yield root, url


@pytest.fixture(scope="module")
def trace() -> list:
    """A real engine run on the shipped model: a shared prompt prefix (prefix caching) and a
    pool of 12 blocks, small enough that requests are preempted."""
    from minillm import LLM, SamplingParams

    llm = LLM(num_kv_blocks=12, block_size=16, enable_prefix_caching=True,
              max_num_batched_tokens=64, device="cpu")
    system = "Once upon a time there was a little house by the sea. " * 3
    llm.generate([system + p for p in ("The king", "A cat", "The old man", "She said")],
                 SamplingParams(max_tokens=24))
    assert llm.stats()["num_preemptions"] > 0 and llm.stats()["prefix_cache_hits"] > 0
    return llm.trace


@pytest.fixture
def views(request: pytest.FixtureRequest) -> dict[str, object]:
    """Makers of every view, by name (the engine runs only for the trace views)."""
    from widgets import (
        BatchTimeline,
        BlockTableView,
        KVCalculator,
        PrefixCacheView,
        RooflineExplorer,
        TilingView,
    )

    def steps() -> list:
        return request.getfixturevalue("trace")

    return {"block_table": lambda: BlockTableView(steps(), step=len(steps()) // 2,
                                                  num_blocks=12),
            "batch_timeline": lambda: BatchTimeline(steps(), budget=64),
            "prefix_cache": lambda: PrefixCacheView(steps(), step=len(steps()) // 2),
            "roofline": RooflineExplorer, "kv_calculator": lambda: KVCalculator(batch=16),
            "tiling": lambda: TilingView(1024, 1024)}


@pytest.fixture
def page(browser: object) -> Iterator[tuple[object, list[str], list[str]]]:
    """A page that aborts every request not to file:// or loopback: (page, errors, blocked)."""
    with offline_page(browser) as opened:
        yield opened


def write_page(root: Path, name: str, body: str, head: str = "") -> str:
    """An HTML page (no favicon request, white background) saved under root; its file name."""
    doc = (f'<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(name)}</title>'
           f'<link rel="icon" href="data:,">{head}</head>'
           f'<body style="margin:8px;background:#fff">{body}</body></html>')
    (root / f"{name}.html").write_text(doc, encoding="utf-8")
    return f"{name}.html"



@pytest.mark.parametrize("name", ["block_table", "batch_timeline", "prefix_cache", "roofline",
                                  "kv_calculator", "tiling"])
def test_static_html_renders_offline(name: str, views: dict[str, object], site: tuple[Path, str],
                                     page: tuple, tmp_path: Path) -> None:
    root, url = site
    pg, errors, blocked = page
    bundle = views[name]()._repr_mimebundle_()
    pg.goto(f"{url}/{write_page(root, name, bundle['text/html'])}")
    svg = pg.locator("svg").first
    svg.wait_for()
    box = svg.bounding_box()
    assert box is not None and box["width"] > 100 and box["height"] > 50
    svg.screenshot(path=str(tmp_path / f"{name}.png"))
    check_painted(tmp_path / f"{name}.png", name)
    assert errors == [] and blocked == []


ESM_HOST = """
<div id="app"></div>
<script id="state" type="application/json">{state}</script>
<script type="module">
import widget from "./view.js";
// A stand-in for anywidget's model: save_changes sends values to the Python ViewWidget
// (exposed as window.pySync) and fires change events for what it sends back.
const state = JSON.parse(document.getElementById("state").textContent);
const listeners = {{}};
const fire = (key) => (listeners["change:" + key] || []).forEach((f) => f());
const model = {{
  get: (key) => state[key],
  set: (key, value) => {{ state[key] = value; }},
  on: (event, f) => {{ (listeners[event] ??= []).push(f); }},
  off: (event, f) => {{ listeners[event] = (listeners[event] || []).filter((g) => g !== f); }},
  save_changes: async () => {{
    const reply = await window.pySync(state.values);
    for (const [key, value] of Object.entries(reply)) {{ state[key] = value; fire(key); }}
    window.syncs = (window.syncs || 0) + 1;
  }},
}};
widget.render({{ model, el: document.getElementById("app") }});
window.ready = true;
</script>
"""


def open_widget(pg: object, view: View, root: Path, url: str, name: str) -> object:
    """Load view.js with the view's ViewWidget state; returns the ViewWidget."""
    w = view.widget()
    pg.expose_function("pySync", lambda values: _sync(w, values))
    state = json.dumps({"svg": w.svg, "controls": w.controls, "values": w.values})
    body = ESM_HOST.format(state=state.replace("</", "<\\/"))
    pg.goto(f"{url}/{write_page(root, name, body, '<link rel=stylesheet href=view.css>')}")
    pg.wait_for_function("window.ready === true")
    return w


def _sync(w: object, values: dict) -> dict:
    """What the kernel does when the browser saves values: set them, return the new state."""
    w.values = values
    return {"controls": w.controls, "values": w.values, "svg": w.svg}


def move_slider(pg: object, label: str, value: int) -> None:
    """Set the range input inside the label that starts with `label`, as a user would."""
    pg.locator("label", has_text=label).locator("input").evaluate(
        "(el, v) => { el.value = String(v); el.dispatchEvent(new Event('input')); }", value)


@pytest.mark.parametrize("name", ["roofline", "kv_calculator", "prefix_cache", "tiling"])
def test_widget_esm_renders_and_round_trips(name: str, views: dict[str, object],
                                            site: tuple[Path, str], page: tuple,
                                            tmp_path: Path) -> None:
    root, url = site
    pg, errors, blocked = page
    view = views[name]()
    w = open_widget(pg, view, root, url, f"{name}-widget")
    assert pg.locator("#app svg").count() == 1
    assert pg.locator("#app select").count() == sum(c["kind"] == "select" for c in w.controls)
    assert pg.locator("#app input[type=range]").count() == sum(
        c["kind"] == "range" for c in w.controls)
    before = pg.inner_html("#app .minillm-picture")
    if name == "roofline":
        move_slider(pg, "decode batch", 64)
        pg.wait_for_function("window.syncs === 1")
        assert view.batch == 64 and "decode, batch 64" in pg.text_content("#app svg")
    elif name == "prefix_cache":
        move_slider(pg, "step", 0)
        pg.wait_for_function("window.syncs === 1")
        assert view.step == 0 and "Prefix cache at step 0 (1 of" in pg.text_content("#app svg")
    elif name == "tiling":
        move_slider(pg, "tiles computed", 5)
        pg.wait_for_function("window.syncs === 1")
        assert view.step == 5 and "tile 5 of 136:" in pg.text_content("#app svg")
    else:
        pg.locator("label", has_text="hardware").locator("select").select_option('"L4"')
        pg.wait_for_function("window.syncs === 1")
        assert view.hardware == "L4" and "on L4" in pg.text_content("#app svg")
    assert pg.inner_html("#app .minillm-picture") != before
    pg.locator("#app").screenshot(path=str(tmp_path / f"{name}-widget.png"))
    check_painted(tmp_path / f"{name}-widget.png", f"{name}-widget")
    assert errors == [] and blocked == []


def test_blocking_is_in_force(site: tuple[Path, str], page: tuple) -> None:
    """The gate really aborts a request that would leave the machine."""
    root, url = site
    pg, errors, blocked = page
    body = '<img src="https://cdn.jsdelivr.net/npm/x.png"><svg width="10" height="10"></svg>'
    pg.goto(f"{url}/{write_page(root, 'remote', body)}")
    pg.wait_for_load_state("load")
    assert blocked == ["https://cdn.jsdelivr.net/npm/x.png"]
