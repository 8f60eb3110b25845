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
| ``token_chart.py`` | the per-step token chart under ``BatchTimeline`` |
| ``pressure.py`` | swaps and waiting causes drawn on the trace views, the host pool panel |
| ``roofline.py`` | ``RooflineExplorer``: the roofline with prefill and decode points |
| ``kv_calculator.py`` | ``KVCalculator``: KV bytes and concurrent sequences per GPU |
| ``tiling.py`` | ``TilingView``: attention's score tiles, in the order the tiled loop visits them |
| ``tile_visits.py`` | the tiled loop's schedule as ``TilingView`` draws it, tile by tile |
| ``slo_view.py`` | ``SLOView``: goodput and the knee of a stored rate sweep, under the SLO set |
"""

from widgets.base import View, ViewWidget
from widgets.block_table import BlockTableView
from widgets.kv_calculator import KVCalculator
from widgets.prefix_cache import PrefixCacheView
from widgets.roofline import RooflineExplorer
from widgets.slo_view import SLOView
from widgets.tiling import TilingView
from widgets.timeline import BatchTimeline

__all__ = ["View", "ViewWidget", "BlockTableView", "PrefixCacheView", "BatchTimeline",
           "RooflineExplorer", "KVCalculator", "TilingView", "SLOView"]
