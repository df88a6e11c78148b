"""Hostile share links: whatever a query parameter holds, the page shows it as typed, never as
an image, a link or emphasis.

Every query parameter the app reads (each `Settings` field and each `Costs` field) gets markup
that would run or mislead if rendered: raw HTML with a script in an attribute, and Markdown
emphasis with a `javascript:` link. Every text element the page draws is then rendered as
CommonMark (what Streamlit's renderer starts from) and must contain none of it.
"""

from __future__ import annotations

import pytest
from app_helpers import app, shown
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from memorymark.settings import COST_NAMES, FIELD_NAMES

pytestmark = pytest.mark.usefixtures("fresh_caches")

PAYLOADS = ("<img src=x onerror=alert(1)>", "**bold**[link](javascript:alert(1))")
# What either payload becomes when rendered rather than shown: an element, a link, emphasis.
RENDERED = ("<img", 'href="javascript', "<strong>bold", "<em>bold")
PAGES = (
    "../pages/1_Compare_GPUs.py",
    "../pages/2_Backward_pass_proof.py",
    "../pages/4_Longest_sequence.py",
    "../pages/5_Scale_out.py",
)
_markdown = MarkdownIt("commonmark")


def texts(at: AppTest) -> list[str]:
    """The Markdown of every element that renders some: bodies, labels, captions, metrics."""
    found = []
    for node in at.main, at.sidebar:
        for kind in ("markdown", "caption", "error", "warning", "info", "success", "title",
                     "header", "subheader", "exception", "toast"):  # fmt: skip
            found += [str(e.value) for e in node.get(kind)]
        for m in node.get("metric"):
            found += [m.label, str(m.value), m.proto.delta]
        found += [e.label for e in node.get("expander")]
    return found


def injected(at: AppTest) -> list[str]:
    """Each text whose rendering holds markup that came from a payload."""
    return [t for t in texts(at) if any(r in _markdown.render(t) for r in RENDERED)]


@pytest.mark.parametrize("name", FIELD_NAMES + COST_NAMES)
def test_a_hostile_value_of_any_parameter_is_shown_as_typed(name: str) -> None:
    at = app(**{name: " ".join(PAYLOADS)})
    assert not at.exception
    assert injected(at) == []


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_hostile_gpu_alone_is_shown_as_typed(payload: str) -> None:
    # The reported links: ?gpu=<img src=x onerror=alert(1)> and ?gpu=**bold**[link](javascript:..)
    at = app(gpu=payload)
    assert not at.exception
    assert injected(at) == []
    assert payload in shown(at.sidebar.warning[0].value)  # the value is there, as text


@pytest.mark.parametrize("path", PAGES)
def test_a_hostile_gpu_is_shown_as_typed_on_every_page(path: str) -> None:
    at = AppTest.from_file(path, default_timeout=60)
    at.query_params.update(gpu=" ".join(PAYLOADS))
    at.run()
    assert not at.exception
    assert injected(at) == []
    warning = at.sidebar.warning[0].value
    assert "unknown GPU" in warning and "onerror" in warning  # shown, as text


def test_the_check_catches_markup_that_is_not_escaped() -> None:
    # The detector itself: the same payloads unescaped would be flagged.
    assert all(any(r in _markdown.render(p) for r in RENDERED) for p in PAYLOADS)
