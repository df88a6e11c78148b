"""The pages' one-shot engine calls (GPU comparison, backward-pass proof), run in the script thread.

Owns caching those results across sessions, taking turns on real hardware with the main page's
sweeps (the same process-wide lock) and turning failures into one line. Must not know what the
results mean or how they are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import streamlit as st

from memorymark.settings import Settings
from memorymark.ui.sweep_runner import device_lock, device_turn, needs_device, one_line, result_cache

T = TypeVar("T")


def cached_result(key: Hashable) -> object | None:
    """A finished page result for `key`, from any session."""
    return result_cache().get(key)


def run_cached(
    key: Hashable, compute: Callable[[], T], *, settings: Settings, spinner: str
) -> tuple[T | None, str | None]:
    """`compute()` once per key: (result, None), or (None, a one-line error)."""
    hit = result_cache().get(key)
    if hit is not None:
        return hit, None
    try:
        real = needs_device(settings)
        lock = device_lock()
        if real and lock.locked():
            st.info("Waiting for the GPU: another session is measuring on it.")
        with st.spinner(spinner):
            if real:
                with device_turn(lock):
                    value = compute()
            else:
                value = compute()
    except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
        return None, one_line(exc)
    result_cache().put(key, value)
    return value, None
