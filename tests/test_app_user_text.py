"""User text in the app's messages renders as typed: never a link, emphasis or HTML."""

from __future__ import annotations

import html
import re

import pytest
from app_helpers import app, shown
from markdown_it import MarkdownIt

from memorymark.ui import views
from memorymark.ui.literal import literal

pytestmark = pytest.mark.usefixtures("fresh_caches")

PHISH = "[Sign in again](//evil.example/login)"
HOSTILE = (
    PHISH,
    "https://evil.example/login",
    "www.evil.example",
    "<a href='//evil.example'>x</a>",
    "*bold* _it_ `code` ~~s~~ $x$ :red[alarm] ![img](//evil.example/i.png)",
    "<https://evil.example>",
    "[ref]\n\n[ref]: //evil.example",
    "back\\slash \\[not a link\\](//evil.example)",
)


# GFM's literal autolinks (remark-gfm, which Streamlit's renderer uses): found in the text nodes
# once parsed, so after backslash escapes are resolved; never inside a code span.
AUTOLINK = re.compile(r"https?://|www\.|[\w.+-]+@[\w-]+\.\w", re.IGNORECASE)


def plain(text: object) -> str:
    """What the app's messages make of user text."""
    return literal(text)


def rendered(markdown: str) -> str:
    """The HTML CommonMark makes of `markdown` (what Streamlit's renderer starts from)."""
    return MarkdownIt("commonmark").render(markdown)


def autolinked(markdown: str) -> list[str]:
    """The parsed text runs of `markdown` that GFM would turn into links."""
    found = []
    for block in MarkdownIt("commonmark").parse(markdown):
        for token in block.children or ():
            if token.type == "text" and AUTOLINK.search(token.content):
                found.append(token.content)
    return found


@pytest.mark.parametrize("text", HOSTILE)
def test_plain_text_renders_as_the_characters_typed(text):
    out = rendered(plain(text))
    assert out == f"<p><code>{html.escape(' '.join(text.split()), quote=False)}</code></p>\n"
    assert autolinked(plain(text)) == []  # no GFM autolink either


def test_the_autolink_check_sees_what_a_backslash_escape_does_not_stop() -> None:
    # The reported link: `?gpu=https://evil.example` was escaped, and still a link in Chromium.
    assert autolinked(r"unknown GPU 'https\:\/\/evil\.example'") != []
    assert autolinked(f"unknown GPU {literal('https://evil.example')}") == []


def test_a_model_name_in_a_link_is_not_a_link_in_the_warning():
    at = app(model=PHISH)
    assert not at.exception
    warning = at.sidebar.warning[0].value
    assert PHISH in shown(warning) and "<a" not in rendered(warning)
    assert autolinked(warning) == []


def test_a_model_name_typed_in_the_text_box_is_not_a_link_in_the_error():
    at = app()
    at.text_input(key="mm_model_spec").set_value(f"x:{PHISH}").run()
    assert not at.exception
    error = at.error[0].value
    assert "unknown model source 'x'" in shown(error)
    at.text_input(key="mm_model_spec").set_value(PHISH).run()
    error = at.error[0].value
    assert PHISH in shown(error) and "<a" not in rendered(error)
    assert "Next step: change it in the sidebar." in error  # our own words stay as written


def test_an_engine_error_quoting_user_text_is_shown_plain(monkeypatch):
    shown_bodies = []
    monkeypatch.setattr(views.st, "error", shown_bodies.append)
    views.show_error(f"could not fetch {PHISH}'s config.json from the Hugging Face hub")
    body = shown_bodies[0]
    assert "<a" not in rendered(body) and autolinked(body) == []
    assert "Next step: download the model's config.json" in body


@pytest.mark.parametrize("gpu", ["https://evil.example", "www.evil.example", "me@evil.example"])
def test_a_url_in_a_link_is_plain_text_in_the_apps_own_warning(gpu):
    # The reported repro: /?gpu=https://evil.example auto-linked inside "Ignored the link's...".
    at = app(gpu=gpu)
    assert not at.exception
    warning = at.sidebar.warning[0].value
    assert warning.startswith("Ignored the link's settings: ")
    assert f"unknown GPU '{gpu}'" in warning and autolinked(warning) == []
