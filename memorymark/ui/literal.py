"""User text in the app's messages, shown as typed: the one helper every echo goes through.

Streamlit renders an alert's or a caption's body as GitHub-flavoured Markdown, and GFM's literal
autolinks (`https://...`, `www....`, `a@b.example`) are found in the text *after* backslash
escapes are resolved (remark-gfm's autolink-literal transform runs on the parsed text), so an
escaped `https\\:\\/\\/evil.example` still becomes a working link in the app's own warning box.
A code span is the one inline form whose content nothing parses further: no link, emphasis,
HTML, :color[...] or $math$. Owns that wrapping; must not know where the text came from.
"""

from __future__ import annotations

import re

EMPTY = "(empty)"
"""What an empty value shows as: a code span of nothing would vanish."""


def literal(text: object) -> str:
    """`text` as a Markdown code span that shows it character for character, on one line.

    Whitespace runs become one space (an alert is one line). The fence is one backtick longer
    than the longest run of backticks inside, and the content is padded with one space each
    side, which CommonMark strips again, so a value starting or ending with a backtick stays
    whole."""
    flat = " ".join(str(text).split())
    if not flat:
        return EMPTY
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {flat} {fence}"
