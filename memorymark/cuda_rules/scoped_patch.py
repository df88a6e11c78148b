"""Replace a library function for the threads that ask, and only while they ask.

The simulation changes a few PyTorch and transformers functions while a step runs (which attention
kernel `scaled_dot_product_attention` calls, how dropout stores its mask, ...). A module attribute
is process-wide, but a Streamlit app runs sweeps in worker threads side by side, and a real CPU run
in another thread must keep the real function. So the attribute is swapped for a dispatcher while
any thread uses the patch, and the dispatcher applies the replacement only in threads inside the
scope. Autograd runs a CPU backward pass (and activation-checkpoint recomputation) on the thread
that called `backward()`, so the scope covers them too, which a `TorchFunctionMode` would not.

This module knows nothing about what is patched or why.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any


class ScopedPatch:
    """`owner.name` replaced by `replacement(original, *args, **kwargs)` inside `active()`."""

    def __init__(self, owner: Any, name: str, replacement: Callable[..., Any]) -> None:
        self.owner = owner
        self.name = name
        self.replacement = replacement
        self._lock = threading.Lock()
        self._users = 0
        self._original: Callable[..., Any] | None = None
        self._local = threading.local()

    def in_scope(self) -> bool:
        """True in a thread that is inside `active()`."""
        return getattr(self._local, "depth", 0) > 0

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Apply the replacement in this thread until the block ends; restore it after the last."""
        with self._lock:
            if self._users == 0:
                # Taken at first use, not at import: whatever is installed then is what comes back.
                self._original = getattr(self.owner, self.name)
                setattr(self.owner, self.name, self._dispatcher(self._original))
            self._users += 1
        self._local.depth = getattr(self._local, "depth", 0) + 1
        try:
            yield
        finally:
            self._local.depth -= 1
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    setattr(self.owner, self.name, self._original)
                    self._original = None

    def _dispatcher(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def dispatch(*args: Any, **kwargs: Any) -> Any:
            if self.in_scope():
                return self.replacement(original, *args, **kwargs)
            return original(*args, **kwargs)

        return dispatch
