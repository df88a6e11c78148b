"""User text in the app's messages: shown as the characters typed, never as markdown.

Streamlit renders the body of st.error, st.warning, st.info and st.markdown as markdown, so a
model name such as `[Sign in again](//evil.example/login)` inside an error would become a working
link in the app's own message. Whatever a user typed or a link carried (a model spec, a query
value, an engine error quoting them) goes through `plain()` before it joins a message; the app's
own wording around it stays markdown. Knows nothing of settings or the engine.
"""

from __future__ import annotations

import re

# Every ASCII punctuation character, each of which CommonMark lets a backslash escape (spec
# 0.31, "Backslash escapes"): links, emphasis, code, HTML, autolinks, Streamlit's :color[...]
# and $math$ all start with one of them.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def plain(text: object) -> str:
    """`text` on one line, with every markdown character escaped so it renders as typed."""
    return _PUNCTUATION.sub(r"\\\1", " ".join(str(text).split()))
