"""User text in the app's messages renders as typed: never a link, emphasis or HTML."""

from __future__ import annotations

import html

import pytest
from app_helpers import app, shown
from markdown_it import MarkdownIt

from memorymark.reporting.markdown import escape
from memorymark.ui import views

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


def plain(text: object) -> str:
    """What the app's messages make of user text."""
    return escape(text, every_punctuation=True)


def rendered(markdown: str) -> str:
    """The HTML CommonMark makes of `markdown` (what Streamlit's renderer starts from)."""
    return MarkdownIt("commonmark").render(markdown)


@pytest.mark.parametrize("text", HOSTILE)
def test_plain_text_renders_as_the_characters_typed(text):
    out = rendered(plain(text))
    assert out == f"<p>{html.escape(' '.join(text.split()), quote=False)}</p>\n"
    assert "https:" not in plain(text) and "www." not in plain(text)  # no GFM autolink either


def test_a_model_name_in_a_link_is_not_a_link_in_the_warning():
    at = app(model=PHISH)
    assert not at.exception
    warning = at.sidebar.warning[0].value
    assert PHISH in shown(warning) and "<a" not in rendered(warning)


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
    assert "<a" not in rendered(body)
    assert "Next step: download the model's config.json" in body
