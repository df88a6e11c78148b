"""The pages' engine calls (GPU comparison, backward-pass proof), run on the server's workers.

Owns caching those results across sessions, running each call as a job on the worker pool (never
in the server process; the worker takes the real device's lock as sweeps do), showing a streamed
run's progress as each item lands, and turning failures into one line. Must not know what the
results mean or how they are drawn.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, TypeVar

import streamlit as st

from memorymark.backends import selection
from memorymark.gpus import GPU
from memorymark.limits import one_line
from memorymark.settings import Settings
from memorymark.ui import sweep_runner

T = TypeVar("T")
R = TypeVar("R")
WAIT_SECONDS = 0.1


def cached_result(key: Hashable) -> object | None:
    """A finished page result for `key`, from any session."""
    return sweep_runner.result_cache().get(key)


def _items(
    call: Callable[..., Iterator[Any]], settings: Settings, args: tuple[Any, ...]
) -> Iterator[Any]:
    """Each item of `call(Session(settings), *args)` as a worker sends it (refused first if the
    server does not allow the backend); the worker's error is raised here."""
    sweep_runner.within_server_limits(settings)
    future, channel = sweep_runner.page_service().submit_items(call, settings, args)
    try:
        told = False
        while True:
            finished = future.done()  # read before draining: nothing sent is then missed
            for kind, payload in channel.drain():
                if kind == "item":
                    yield payload
                elif (kind, payload) == ("state", "waiting") and not told:
                    st.info("Waiting for the GPU: another session is measuring on it.")
                    told = True
            if finished:
                future.result()  # a failure in the worker raises here
                return
            time.sleep(WAIT_SECONDS)
    finally:
        if not future.done():  # the page stopped (a rerun): the worker is not needed any more
            channel.request_stop()
            future.cancel()
        channel.close()


def run_cached(
    key: Hashable,
    call: Callable[..., Iterator[T]],
    args: tuple[Any, ...],
    *,
    settings: Settings,
    spinner: str,
) -> tuple[T | None, str | None]:
    """The one item of `call(Session(settings), *args)`, once per key, computed in a worker:
    (result, None), or (None, a one-line error)."""
    hit = sweep_runner.result_cache().get(key)
    if hit is not None:
        return hit, None
    try:
        with st.spinner(spinner):
            (value,) = list(_items(call, settings, args))
    except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
        return None, one_line(exc)
    sweep_runner.result_cache().put(key, value)
    return value, None


def run_streamed(
    key: Hashable,
    call: Callable[..., Iterator[T]],
    args: tuple[Any, ...],
    *,
    settings: Settings,
    steps: Sequence[str],
    describe: Callable[[T], str],
    build: Callable[[list[T]], R],
    ends_with_result: bool = False,
) -> tuple[R | None, str | None]:
    """Like `run_cached`, for an engine generator: a status box names the step that runs
    (`steps`, in order) and lists each item (`describe`) as it lands; `build` makes the result.
    `ends_with_result`: the last item is the result the worker built, not one more measured."""
    hit = sweep_runner.result_cache().get(key)
    if hit is not None:
        return hit, None
    done: list[T] = []
    with st.status(f"Measuring: {steps[0]}...", expanded=True) as status:
        try:
            for item in _items(call, settings, args):
                done.append(item)
                st.write(describe(item))
                if len(done) < len(steps):
                    status.update(label=f"Measuring: {steps[len(done)]}...", expanded=True)
        except Exception as exc:  # noqa: BLE001 - shown as st.error with a next step
            status.update(label="Failed", state="error")
            return None, one_line(exc)
        measured = len(done) - 1 if ends_with_result and done else len(done)
        status.update(label=f"All {measured} measured", state="complete", expanded=False)
    value = build(done)
    sweep_runner.result_cache().put(key, value)
    return value, None


def gpu_for(settings: Settings) -> GPU:
    """The GPU `settings` measure or simulate against, as one rank sees it: the engine's own
    decision (memorymark/backends/selection.py) on the GPUs a worker reported, so the server
    builds no Session (no torch, no model read)."""
    return selection.answering_gpu(settings, sweep_runner.local_gpus())
