"""The playground page at `/` of `dlmrt serve`: one static HTML + JS file shipped in the package
(`dlmrt/server/playground.html`, package data in setup.py): no build step, no CDN. It streams a
request with drafts on and draws every `event: draft` (`docs/drafts.md`)."""

from __future__ import annotations

from functools import cache
from importlib import resources

PAGE = "playground.html"


@cache
def page_html() -> str:
    """The page's text, read once from the installed package."""
    return resources.files("dlmrt.server").joinpath(PAGE).read_text(encoding="utf-8")
