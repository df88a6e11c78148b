"""The pages' one-shot engine calls (GPU comparison, backward-pass proof), run in the script thread.

Owns caching those results across sessions, taking turns on real hardware with the main page's
sweeps (the same process-wide lock) and turning failures into one line. Must not know what the
results mean or how they are drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import streamlit as st

from memorymark.devices import resolve_backend_name, resolve_gpu
from memorymark.gpus import GPU
from memorymark.settings import Settings
from memorymark.ui import sweep_runner

T = TypeVar("T")


def cached_result(key: Hashable) -> object | None:
    """A finished page result for `key`, from any session."""
    return sweep_runner.result_cache().get(key)


def run_cached(
    key: Hashable, compute: Callable[[], T], *, settings: Settings, spinner: str
) -> tuple[T | None, str | None]:
    """`compute()` once per key: (result, None), or (None, a one-line error)."""
    hit = sweep_runner.result_cache().get(key)
    if hit is not None:
        return hit, None
    try:
        real = sweep_runner.needs_device(settings)
        lock = sweep_runner.device_lock()
        if real and lock.locked():
            st.info("Waiting for the GPU: another session is measuring on it.")
        with st.spinner(spinner):
            if real:
                with sweep_runner.device_turn(lock):
                    value = compute()
            else:
                value = compute()
    except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
        return None, sweep_runner.one_line(exc)
    sweep_runner.result_cache().put(key, value)
    return value, None


def gpu_for(settings: Settings) -> GPU:
    """The GPU `settings` measure or simulate against (resolved as the engine does)."""
    return resolve_gpu(settings, resolve_backend_name(settings))
