"""The base of every view: a picture (SVG) of its state, static where there is no kernel.

API (small and stable; the trace views, the roofline and the KV calculator build on it):

- ``class View``: subclass it and implement ``to_svg() -> str`` (a complete ``<svg>``, see
  ``widgets.svg``) for the current state. The state is a few plain attributes (an integer
  ``step``, a model name, a batch size) that ``controls()`` describes, one dict per attribute,
  made with ``slider(name, min, max, step=1, label=None, play=False)`` or ``dropdown(name,
  options, label=None)``. ``get_state()`` returns ``{name: value}`` for those attributes and
  ``set_state(state)`` sets them through ``setattr`` (so a property may validate or clamp).
  Override ``get_state``/``set_state`` only if the state is not plain attributes.
- ``View._repr_mimebundle_()`` gives ``text/html`` and ``text/plain``, so a notebook shows a
  picture in JupyterLab, on GitHub, on the static site and in nbval runs. The HTML also
  carries the pictures of the states ``offline_controls()`` names and an inline script that
  replays them (``widgets.offline``), so the controls work on a page with no kernel.
- ``View.widget()`` returns a ``ViewWidget`` (an ``anywidget.AnyWidget``): the same picture
  above its controls. Its synced traits are ``svg`` (the picture), ``controls`` (the list
  above) and ``values`` (the state dict). Moving a control sets ``values``; Python then calls
  ``view.set_state(values)`` and recomputes ``svg``. Setting ``widget.values`` (or
  ``widget.set_state({"values": {...}})``) from Python re-renders the same way. Its JS and CSS
  are in ``widgets/static/`` (no CDN); its mimebundle also carries ``text/html``, so a page
  saved without widget state still shows the picture.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anywidget
import traitlets

from widgets import offline

STATIC = Path(__file__).parent / "static"


def slider(name: str, min: float, max: float, step: float = 1, label: str | None = None,
           play: bool = False) -> dict[str, Any]:
    """A control: a range input over [min, max] for the numeric attribute name; play adds a
    button that steps the value to max, as a replay."""
    return {"name": name, "kind": "range", "min": min, "max": max, "step": step,
            "label": label or name, "play": play}


def dropdown(name: str, options: list[Any] | dict[str, Any],
             label: str | None = None) -> dict[str, Any]:
    """A control: a choice of options (values, or {label: value}) for the attribute name."""
    pairs = options.items() if isinstance(options, dict) else ((str(o), o) for o in options)
    return {"name": name, "kind": "select", "options": [[str(k), v] for k, v in pairs],
            "label": label or name}


class View:
    """A picture of some state, drawn as SVG; subclasses implement to_svg (and controls)."""

    def to_svg(self) -> str:
        """The picture of the current state: a complete <svg> string."""
        raise NotImplementedError

    def controls(self) -> list[dict[str, Any]]:
        """The controls of the interactive widget, made with slider() and dropdown()."""
        return []

    def get_state(self) -> dict[str, Any]:
        """The state the controls edit, as {name: value}."""
        return {c["name"]: getattr(self, c["name"]) for c in self.controls()}

    def set_state(self, state: dict[str, Any]) -> None:
        """Set the named parts of the state (names not among the controls are an error)."""
        names = {c["name"] for c in self.controls()}
        unknown = set(state) - names
        if unknown:
            raise KeyError(f"{type(self).__name__} has no state {sorted(unknown)}; "
                           f"it has {sorted(names)}")
        for name, value in state.items():
            setattr(self, name, value)

    def offline_controls(self) -> list[tuple[dict[str, Any], list[Any]]]:
        """The controls a page without a kernel keeps, each with the values it precomputes
        (widgets.offline): by default a "step" slider at up to MAX_STEPS evenly spaced steps
        and every dropdown of up to 4 options; other controls keep their value. A view with a
        larger state space overrides it to offer a few values of one or two controls."""
        state, axes = self.get_state(), []
        for c in self.controls():
            if c["kind"] == "range" and c["name"] == "step":
                steps = list(range(int(c["min"]), int(c["max"]) + 1, int(c["step"])))
                axes.append((c, offline.spaced(steps, state["step"], offline.MAX_STEPS)))
            elif c["kind"] == "select" and len(c["options"]) <= 4:
                axes.append((c, [value for _, value in c["options"]]))
        return axes

    def widget(self) -> ViewWidget:
        """An interactive widget for JupyterLab that edits this view's state."""
        return ViewWidget(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None,
                          **kwargs: Any) -> dict[str, str]:
        return {"text/html": offline.offline_html(self), "text/plain": repr(self)}

    def __repr__(self) -> str:
        state = ", ".join(f"{k}={v!r}" for k, v in self.get_state().items())
        return f"{type(self).__name__}({state})"


class TraceView(View):
    """A view that replays an engine (or simulator) trace: step picks the StepRecord shown."""

    trace: list

    @property
    def step(self) -> int:
        """The index of the StepRecord shown (clamped to the trace)."""
        return self._step

    @step.setter
    def step(self, value: int) -> None:
        self._step = min(max(int(value), 0), len(self.trace) - 1)


class ViewWidget(anywidget.AnyWidget):
    """A View's picture above its controls; Python re-renders svg when values change."""

    _esm = STATIC / "view.js"
    _css = STATIC / "view.css"
    svg = traitlets.Unicode("").tag(sync=True)
    controls = traitlets.List().tag(sync=True)
    values = traitlets.Dict().tag(sync=True)

    def __init__(self, view: View, **kwargs: Any):
        self.view = view
        super().__init__(svg=view.to_svg(), controls=view.controls(), values=view.get_state(),
                         **kwargs)

    @traitlets.observe("values")
    def _values_changed(self, change: dict[str, Any]) -> None:
        self.view.set_state(change["new"])
        self.controls = self.view.controls()  # a choice may change another control's range
        self.values = self.view.get_state()  # the view may have clamped a value
        self.svg = self.view.to_svg()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        bundle = super()._repr_mimebundle_(**kwargs)
        if bundle is None:
            return None
        data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
        return {**data, "text/html": f"<div>{self.svg}</div>"}, metadata
