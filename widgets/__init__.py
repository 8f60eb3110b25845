"""Widgets that replay minillm's traces in Jupyter (block tables, batch timeline, roofline).

The views arrive with the widgets issue; the package exists so the distribution's layout is fixed.
"""
