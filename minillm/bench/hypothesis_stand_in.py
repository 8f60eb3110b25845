"""A pytest plugin for the GPU run: where Hypothesis is missing, its tests skip, the rest run.

The kernel tests import Hypothesis at the top for a few property tests; a lent GPU machine may
have pytest but not Hypothesis, and then not one kernel test would run there. Loaded with
`pytest -p minillm.bench.hypothesis_stand_in`, this puts a stand-in `hypothesis` in
sys.modules (only where the real one cannot be imported): `@given` tests skip with the reason,
and strategies, `settings` and the rest are inert, so every other test of the module runs.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

import pytest

from minillm.bench.chapter_cells import _StandIn

REASON = "hypothesis is not installed here"


def given(*args: object, **kwargs: object) -> Callable[[Callable[..., object]], object]:
    """A property test becomes a skipped test of the same name (no arguments to resolve)."""
    def skipped_instead(test: Callable[..., object]) -> object:
        def skipped(*args: object, **kwargs: object) -> None:
            pytest.skip(REASON)
        skipped.__name__, skipped.__qualname__ = test.__name__, test.__qualname__
        return pytest.mark.skip(reason=REASON)(skipped)
    return skipped_instead


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    def attribute(attr: str) -> object:
        if attr.startswith("__"):  # inspect and pytest read dunders: they must not be stand-ins
            raise AttributeError(attr)
        return _StandIn()
    module.__getattr__ = attribute  # type: ignore[method-assign]
    return module


def install() -> bool:
    """Put the stand-in in place if Hypothesis cannot be imported; True if it did."""
    try:
        import hypothesis  # noqa: F401 - the real one, where it is installed
        return False
    except ImportError:
        pass
    root = _module("hypothesis")
    root.given = given  # type: ignore[attr-defined]
    root.__path__ = []  # a package, so `from hypothesis.stateful import ...` works
    sys.modules["hypothesis"] = root
    for sub in ("strategies", "stateful", "extra", "extra.numpy"):
        sys.modules[f"hypothesis.{sub}"] = _module(f"hypothesis.{sub}")
    root.strategies = strategies = sys.modules["hypothesis.strategies"]  # type: ignore[attr-defined]
    # A composite strategy's body must not run (it would call draw): calling it gives a stand-in.
    strategies.composite = lambda body: lambda *args, **kwargs: _StandIn()  # type: ignore[attr-defined]
    return True


install()
