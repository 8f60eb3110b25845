"""Widgets that replay minillm's traces in Jupyter: block tables, prefix cache, batch timeline,
roofline, KV.

Every view is a ``View`` (``widgets.base``): ``to_svg()`` draws its current state, displaying it
shows that SVG (JupyterLab, GitHub, the static site, nbval), and ``view.widget()`` is the
interactive anywidget (sliders, dropdowns) for JupyterLab.

| module | owns |
|---|---|
| ``svg.py`` | the colour-blind-safe palette and the SVG string builders |
| ``base.py`` | ``View`` and its interactive ``ViewWidget`` (JS/CSS in ``static/``) |
| ``block_table.py`` | ``BlockTableView``: the paged KV pool and block tables at one step |
| ``prefix_cache.py`` | ``PrefixCacheView``: the prefix cache tree, holders, evictions |
| ``prefix_tree.py`` | the tree layout behind ``PrefixCacheView`` |
| ``timeline.py`` | ``BatchTimeline``: requests × steps, phases, token budget use |
| ``roofline.py`` | ``RooflineExplorer``: the roofline with prefill and decode points |
| ``kv_calculator.py`` | ``KVCalculator``: KV bytes and concurrent sequences per GPU |
"""

from widgets.base import View, ViewWidget
from widgets.block_table import BlockTableView
from widgets.prefix_cache import PrefixCacheView
from widgets.timeline import BatchTimeline

__all__ = ["View", "ViewWidget", "BlockTableView", "PrefixCacheView", "BatchTimeline"]

# RooflineExplorer and KVCalculator are written alongside these views in roofline.py and
# kv_calculator.py. Until both modules exist, import them guarded so the package still imports;
# once they have landed, replace this block with plain imports.
try:
    from widgets.roofline import RooflineExplorer  # noqa: F401

    __all__.append("RooflineExplorer")
except ImportError:
    pass
try:
    from widgets.kv_calculator import KVCalculator  # noqa: F401

    __all__.append("KVCalculator")
except ImportError:
    pass
