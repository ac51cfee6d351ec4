"""MkDocs hook: the pages' formulas become MathML when the site is built.

``pymdownx.arithmatex`` (generic mode) finds ``$...$`` and ``$$...$$`` outside code and wraps
their LaTeX; this hook replaces each with the MathML that latex2mathml makes of it. Browsers
render MathML themselves, so the site needs no JavaScript math library and no network.
"""

from __future__ import annotations

import html
import re

from latex2mathml.converter import convert

_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


def on_page_content(content: str, **_) -> str:
    """Replace arithmatex's wrapped LaTeX in a page's HTML with MathML (an MkDocs event)."""
    content = _BLOCK.sub(lambda m: convert(html.unescape(m.group(1)), display="block"), content)
    return _INLINE.sub(lambda m: convert(html.unescape(m.group(1))), content)
