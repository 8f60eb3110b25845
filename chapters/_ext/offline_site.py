"""A Sphinx extension that keeps the built site self-contained.

Jupyter Book 1.x always loads sphinx-thebe, which adds its configuration script twice (a
"THEBE_JS_URL has already been declared" error in every page's console) and would fetch thebe
itself from unpkg.com when used. The chapters are run on Binder or locally instead, so every
page drops thebe's scripts: nothing on the site reaches for the network.
"""

from __future__ import annotations

from typing import Any


def is_thebe(script: Any) -> bool:
    filename = str(getattr(script, "filename", script) or "")
    body = str(getattr(script, "attributes", {}).get("body", ""))
    return "thebe" in filename or "THEBE_JS_URL" in body


def drop_thebe(app: Any, pagename: str, templatename: str, context: dict,
               doctree: Any) -> None:
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not is_thebe(s)]


def setup(app: Any) -> dict[str, bool]:
    app.connect("html-page-context", drop_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
