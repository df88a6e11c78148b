"""The session-state keys of the sidebar's values, shared by the modules that draw its widgets.

Every sidebar value lives under `mm_<name>`: each `Settings` and `Costs` field by its own name,
plus the few choices that are not fields (which GPU entry, which model spec). Must not know what
the values mean.
"""

from __future__ import annotations

from dataclasses import fields

from memorymark.settings import Costs, Settings

SETTING_FIELDS = tuple(f.name for f in fields(Settings))
COST_FIELDS = tuple(f.name for f in fields(Costs))
STATE_KEYS = (*SETTING_FIELDS, *COST_FIELDS, "gpu_choice", "price_for", "model_spec", "task_for")
"""The values kept alive across pages (not the upload widget: Streamlit cannot set one)."""


def key(name: str) -> str:
    """The session-state key of one sidebar value."""
    return f"mm_{name}"
