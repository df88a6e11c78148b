"""How a worker's messages come back to whoever submitted its job, one channel per job.

Owns the `Channel` protocol (the worker `put`s messages in order and checks `stop_requested`
between probes; the submitter `drain`s them and may `request_stop`) and its three kinds: a pipe
to a local worker process, a queue to a thread of this process, and a Dask queue and event to a
cluster worker. Messages are (kind, payload) tuples of plain picklable values. Knows nothing of
what the messages mean; never imports torch or Streamlit.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import threading
from multiprocessing.connection import Connection
from typing import Any, Protocol


class Channel(Protocol):
    """The worker's way back to the submitter (messages in order) and the submitter's way to ask
    a worker that cannot be killed (a Dask thread) to stop between probes."""

    def put(self, message: tuple[str, Any]) -> None: ...

    def stop_requested(self) -> bool: ...


class PipeChannel:
    """To a local worker process: one pipe, written by the worker, read by the submitter."""

    def __init__(self) -> None:
        self.reader: Connection | None  # None in the worker, which only writes
        self.reader, self.writer = multiprocessing.Pipe(duplex=False)

    def __getstate__(self) -> dict[str, Any]:
        return {"writer": self.writer}  # the worker gets the end it writes to

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.reader, self.writer = None, state["writer"]

    def put(self, message: tuple[str, Any]) -> None:
        self.writer.send(message)

    def stop_requested(self) -> bool:
        return False  # a local worker is killed instead

    def request_stop(self) -> None:
        """Nothing to do: the pool kills the process."""

    def drain(self) -> list[tuple[str, Any]]:
        out: list[tuple[str, Any]] = []
        if self.reader is None:
            return out
        try:
            while self.reader.poll():
                out.append(self.reader.recv())
        except (EOFError, OSError, pickle.UnpicklingError):  # a killed worker, mid-message
            pass
        return out

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        self.writer.close()


class ThreadChannel:
    """To a sweep on a thread of this process (tests, and `inline_service`): a queue, and an
    event the sweep checks between probes."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.stop = threading.Event()

    def put(self, message: tuple[str, Any]) -> None:
        self.queue.put(message)

    def stop_requested(self) -> bool:
        return self.stop.is_set()

    def request_stop(self) -> None:
        self.stop.set()

    def drain(self) -> list[tuple[str, Any]]:
        out = []
        while not self.queue.empty():
            out.append(self.queue.get())
        return out

    def close(self) -> None:
        """Nothing to free."""


class DaskChannel:
    """To a Dask worker: a distributed Queue of pickled messages (it carries msgpack bytes) and a
    distributed Event the worker checks between probes (a Dask task cannot be killed)."""

    def __init__(self, client: Any) -> None:
        import distributed

        self.queue = distributed.Queue(client=client)
        self.stop = distributed.Event(client=client)

    def put(self, message: tuple[str, Any]) -> None:
        self.queue.put(pickle.dumps(message))

    def stop_requested(self) -> bool:
        return bool(self.stop.is_set())

    def request_stop(self) -> None:
        self.stop.set()

    def drain(self) -> list[tuple[str, Any]]:
        return [pickle.loads(item) for item in self.queue.get(batch=True)]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.queue.close()
