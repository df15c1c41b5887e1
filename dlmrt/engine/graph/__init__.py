"""See `dlmrt/engine/__init__.py`."""
