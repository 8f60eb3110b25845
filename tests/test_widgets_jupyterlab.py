"""The widgets end to end in a real JupyterLab: server, kernel, widget manager and Chromium.

One slow test writes a notebook that runs the engine on the shipped model (a shared prompt
prefix, a pool of 12 KV blocks) and shows ``BlockTableView(...).widget()`` and
``KVCalculator().widget()``; starts ``jupyter lab`` on 127.0.0.1 (no token, a clean Jupyter
config/data/runtime dir in tmp, news and update checks off); opens the notebook in headless
Chromium (playwright; every request not to loopback is aborted), runs all cells through
``window.jupyterapp`` (exposed with ``LabApp.expose_app_in_browser``), waits for both widgets to
draw an <svg>, moves the block table's step slider with the keyboard and checks the picture
changed (the value went to the kernel and a new svg came back). No console errors are allowed
and neither widget's screenshot may be blank (copies go to /tmp/widget-shots/). The server
(and its kernel) is always shut down. Skips where anywidget, ipywidgets, jupyterlab,
playwright, Pillow or chromium is missing (never `playwright install`).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("anywidget", reason="the widgets need the [book] extra (anywidget)")
pytest.importorskip("ipywidgets", reason="the widgets need the [book] extra (ipywidgets)")
pytest.importorskip("jupyterlab", reason="needs JupyterLab (the [book] extra)")
pytest.importorskip("ipykernel", reason="needs ipykernel to run the notebook")

REPO = Path(__file__).resolve().parents[1]
NOTEBOOK = "widgets.ipynb"



from browser_support import LOOPBACK, check_painted, require_browser  # noqa: E402

CHROMIUM = require_browser()
from playwright import sync_api  # noqa: E402

CELLS = [
    "from minillm import LLM, SamplingParams\n"
    "from widgets import BlockTableView, KVCalculator\n"
    "\n"
    "llm = LLM(num_kv_blocks=12, enable_prefix_caching=True, max_num_batched_tokens=64,\n"
    "          device='cpu')\n"
    "system = 'Once upon a time there was a little house by the sea. ' * 3\n"
    "prompts = [system + p for p in ('The king', 'A cat', 'The old man', 'She said')]\n"
    "llm.generate(prompts, SamplingParams(max_tokens=12, temperature=0, ignore_eos=True),\n"
    "             use_tqdm=False)\n"
    "len(llm.trace)",
    "BlockTableView(llm.trace, num_blocks=12).widget()",
    "KVCalculator().widget()",
]


def write_notebook(path: Path) -> None:
    """A v4 notebook of CELLS, no outputs, on the python3 kernel."""
    cells = [{"cell_type": "code", "execution_count": None, "id": f"cell{i}", "metadata": {},
              "outputs": [], "source": src} for i, src in enumerate(CELLS)]
    nb = {"cells": cells, "nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"},
                       "language_info": {"name": "python"}}}
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the server (it shuts its kernels down), then kill its process group if it (or a
    kernel) lingers."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # its own session: only what it started
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[str]:
    """A JupyterLab server on 127.0.0.1 serving a folder with the notebook: its base URL."""
    root = tmp_path / "nb"
    root.mkdir()
    write_notebook(root / NOTEBOOK)
    jupyter = tmp_path / "jupyter"
    config_dir = jupyter / "config"
    config_dir.mkdir(parents=True)
    port = free_port()
    config = {
        "ServerApp": {"ip": "127.0.0.1", "port": port, "port_retries": 0,
                      "open_browser": False, "root_dir": str(root),
                      "allow_root": getattr(os, "geteuid", lambda: 1)() == 0},
        "IdentityProvider": {"token": ""},
        "PasswordIdentityProvider": {"hashed_password": ""},
        "LabApp": {"expose_app_in_browser": True, "news_url": None,
                   "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }
    (config_dir / "jupyter_server_config.json").write_text(json.dumps(config))
    # No "get notified about Jupyter news?" toast over the notebook.
    settings = config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config_dir),
           "JUPYTER_DATA_DIR": str(jupyter / "data"),
           "JUPYTER_RUNTIME_DIR": str(jupyter / "runtime"),
           "IPYTHONDIR": str(jupyter / "ipython"),
           "JUPYTER_PLATFORM_DIRS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH"))
                                         if p),
           "OMP_NUM_THREADS": "1"}
    log = (tmp_path / "lab.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser"],
                            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 45
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited ({proc.returncode}):\n"
                            + (tmp_path / "lab.log").read_text(errors="replace")[-3000:])
            try:
                with urllib.request.urlopen(f"{url}/api/status", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("jupyter lab did not answer in 45 s:\n"
                            + (tmp_path / "lab.log").read_text(errors="replace")[-3000:])
            time.sleep(0.25)
        yield url
    finally:
        stop(proc)
        log.close()



RUN_ALL = """async (name) => {
  const app = window.jupyterapp;
  await app.started;
  await app.restored;
  const panel = app.shell.currentWidget;
  if (!panel || !panel.sessionContext || panel.context.path !== name) {
    throw new Error(`the current widget is not ${name}: ${panel && panel.title.label}`);
  }
  await panel.context.ready;
  await panel.sessionContext.ready;
  const kernel = panel.sessionContext.session.kernel;
  for (let i = 0; i < 300 && kernel.connectionStatus !== "connected"; i++) {
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  await kernel.info;
  await app.commands.execute("notebook:run-all-cells");
}"""


@pytest.mark.slow
def test_widgets_run_in_jupyterlab(lab: str, tmp_path: Path) -> None:
    errors: list[str] = []
    blocked: list[str] = []

    def gate(route: object) -> None:
        if urllib.parse.urlsplit(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()

    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.set_default_timeout(30_000)
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", gate)

            page.goto(f"{lab}/lab/tree/{NOTEBOOK}")
            page.wait_for_function("() => window.jupyterapp !== undefined")
            page.locator(".jp-Notebook .jp-Cell").nth(len(CELLS) - 1).wait_for()
            # Run All only once the notebook's kernel is up (before, the cells are skipped).
            page.evaluate(RUN_ALL, NOTEBOOK)

            views = page.locator(".jp-OutputArea-output .minillm-view")
            try:
                page.wait_for_function(
                    "() => document.querySelectorAll('.jp-OutputArea-output .minillm-view svg')"
                    ".length >= 2", timeout=60_000)
            except sync_api.TimeoutError:
                page.screenshot(path=str(tmp_path / "page.png"))
                outputs = page.locator(".jp-OutputArea-output").all_inner_texts()
                pytest.fail(f"no widget svg after 60 s; outputs: {outputs}; errors: {errors}; "
                            f"blocked: {blocked}; page: {tmp_path / 'page.png'}")
            table, calculator = views.nth(0), views.nth(1)
            assert table.locator("input[type=range]").count() == 1  # the step slider
            assert calculator.locator("select").count() >= 1

            slider = table.locator("input[type=range]")
            before = table.locator(".minillm-picture").inner_html()
            start = slider.input_value()
            slider.focus()
            page.keyboard.press("Home" if start != slider.get_attribute("min") else "End")
            assert slider.input_value() != start
            page.wait_for_function(
                "([el, old]) => el.innerHTML !== old && el.querySelector('svg')",
                arg=[table.locator(".minillm-picture").element_handle(), before])
            step = slider.input_value()
            assert table.locator("output").inner_text() == step
            # The kernel redrew the picture for the new step (the svg is made only in Python).
            assert f"step {step} " in table.locator(".minillm-picture svg").text_content()

            for name, view in (("block_table", table), ("kv_calculator", calculator)):
                shot = tmp_path / f"jupyterlab_{name}.png"
                view.screenshot(path=str(shot))
                check_painted(shot, f"jupyterlab_{name}")
        finally:
            browser.close()

    assert errors == [], f"console errors: {errors}"
    assert blocked == [], f"requests left the machine: {blocked}"
