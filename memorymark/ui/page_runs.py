"""The pages' engine calls (GPU comparison, backward-pass proof), run in the script thread.

Owns caching those results across sessions, taking turns on real hardware with the main page's
sweeps (the same process-wide lock), showing a streamed run's progress as each item lands, and
turning failures into one line. Must not know what the results mean or how they are drawn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import TypeVar

import streamlit as st

from memorymark.engine import Session
from memorymark.gpus import GPU
from memorymark.settings import Settings
from memorymark.ui import sweep_runner

T = TypeVar("T")
R = TypeVar("R")


def cached_result(key: Hashable) -> object | None:
    """A finished page result for `key`, from any session."""
    return sweep_runner.result_cache().get(key)


@contextlib.contextmanager
def _device_turn(settings: Settings) -> Iterator[None]:
    """Refuse what the server does not allow (the cpu backend), and hold the real device's lock
    (the one the workers' sweeps take) when `settings` run on real hardware."""
    sweep_runner.within_server_limits(settings)
    with sweep_runner.device_turn(settings):
        yield


def run_cached(
    key: Hashable, compute: Callable[[], T], *, settings: Settings, spinner: str
) -> tuple[T | None, str | None]:
    """`compute()` once per key: (result, None), or (None, a one-line error)."""
    hit = sweep_runner.result_cache().get(key)
    if hit is not None:
        return hit, None
    try:
        with _device_turn(settings), st.spinner(spinner):
            value = compute()
    except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
        return None, sweep_runner.one_line(exc)
    sweep_runner.result_cache().put(key, value)
    return value, None


def run_streamed(
    key: Hashable,
    items: Callable[[], Iterator[T]],
    *,
    settings: Settings,
    steps: Sequence[str],
    describe: Callable[[T], str],
    build: Callable[[list[T]], R],
) -> tuple[R | None, str | None]:
    """Like `run_cached`, for an engine generator: a status box names the step that runs
    (`steps`, in order) and lists each item (`describe`) as it lands; `build` makes the result."""
    hit = sweep_runner.result_cache().get(key)
    if hit is not None:
        return hit, None
    done: list[T] = []
    with st.status(f"Measuring: {steps[0]}...", expanded=True) as status:
        try:
            with _device_turn(settings), contextlib.closing(items()) as stream:
                for item in stream:
                    done.append(item)
                    st.write(describe(item))
                    if len(done) < len(steps):
                        status.update(label=f"Measuring: {steps[len(done)]}...", expanded=True)
        except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
            status.update(label="Failed", state="error")
            return None, sweep_runner.one_line(exc)
        status.update(label=f"All {len(done)} measured", state="complete", expanded=False)
    value = build(done)
    sweep_runner.result_cache().put(key, value)
    return value, None


def gpu_for(settings: Settings) -> GPU:
    """The GPU `settings` measure or simulate against (resolved as the engine does)."""
    return Session(settings).gpu
