"""MkDocs hook: the docstrings' Sphinx roles (``:func:`name```) read as plain code on the site.

heatinv's docstrings name other objects with Sphinx roles, which Python's ``help`` and IDEs
show as they are; mkdocstrings leaves the role's prefix in the rendered text
(``:func:<code>relevance</code>``). The prefix goes; the name stays as code.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj):(<code>)")


def on_page_content(content: str, **_) -> str:
    """Drop the role prefixes from a page's HTML (an MkDocs event)."""
    return _ROLE.sub(r"\1", content)
