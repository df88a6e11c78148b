"""What the server that hosts the app allows: ceilings no link can raise, and where sweeps run.

Owns `ServerConfig`, read from the environment (`MEMORYMARK_*`) or, for keys the environment does
not set, a mapping such as Streamlit's `st.secrets` (.streamlit/secrets.toml), and `apply`, which
brings a user's `Settings` under the ceilings: a time limit, a probe count, a largest batch and a
time limit for the ways out no higher than the server's (a sweep with none gets the server's),
and the `cpu` backend (real
training steps in the server's own memory) refused unless the server enables it. The settings
`apply` returns are what a worker runs; links, commands and reports keep the user's own (see
memorymark/service/jobs.py), so a ceiling is never written into a link.

`MEMORYMARK_HOSTED=true` is the one switch a hosting guide sets: every visitor keeps a history of
their own (memorymark/ui/history_views.py), no page shows a path on the server, user code and the
`cpu` backend are off whatever else is set, and the pool is sized for a free host (one job at a
time, 2 GiB each, unless the environment or secrets say otherwise). Knows nothing of Streamlit
or torch: the app passes its secrets in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memorymark import limits
from memorymark.settings import Settings
from memorymark.units import GIB

PREFIX = "MEMORYMARK_"
CEILING_FIELDS = ("time_limit_seconds", "max_probes", "max_batch", "ways_out_time_limit_seconds")
"""The `Search` fields a server puts a ceiling on (`apply`)."""
# What a hosted app allows when the server says nothing: a BERT-large sweep takes about 15 s
# here and a Llama-3.1-70B one under a minute, so 5 minutes and 64 probes leave room for every
# catalog model while no single session can hold a worker for long.
DEFAULT_MAX_TIME_LIMIT_SECONDS = 300.0
DEFAULT_MAX_WAYS_OUT_TIME_LIMIT_SECONDS = 300.0
"""When nothing fits, the search for ways out gets its own time after the sweep's: for
Llama-3.1-70B on an A10 it counts the states of each change, then steps the model on bigger GPUs
and sharded over many A10s; with the depth replay every stage ends inside 300 s here (in the
app, the sweep and all 11 ways out took 39 s on a 2-core machine: docs/cli.md)."""
DEFAULT_MAX_PROBES = 64
HOSTED_WORKERS = 1
"""Sweep workers on a hosted server. Streamlit Community Cloud gives an app at most 2 cores and
2.7 GB ("CPU: 0.078 cores minimum, 2 cores maximum; Memory: 690MB minimum, 2.7GBs maximum", its
docs' limits as of February 2024), and each job's process holds torch (README, "What a host
needs", has the measured memory). More visitors queue, and the page says where they are."""
HOSTED_WORKER_MEMORY_GIB = 2.0
"""What each job's process may allocate beyond its libraries on a hosted server, unless
MEMORYMARK_WORKER_MEMORY_GIB says otherwise: with the server and the forkserver (about 0.4 GiB
together, measured) it stays under Community Cloud's 2.7 GB."""
DEFAULT_WORKER_MEMORY_GIB = 8.0
"""Beyond the preloaded libraries: a simulated 70B sweep holds well under 2 GiB of Python
objects; a real cpu-backend step of a large model would need far more (and is off by default)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """The hosted app's ceilings and executor; every field has a `MEMORYMARK_<NAME>` variable."""

    max_time_limit: float = DEFAULT_MAX_TIME_LIMIT_SECONDS
    """Seconds a sweep may take at most (MEMORYMARK_MAX_TIME_LIMIT)."""
    max_probes: int = DEFAULT_MAX_PROBES
    """Probes a sweep may take at most (MEMORYMARK_MAX_PROBES)."""
    max_ways_out_time_limit: float = DEFAULT_MAX_WAYS_OUT_TIME_LIMIT_SECONDS
    """Seconds the search for ways out may take at most when nothing fits, after the sweep
    (MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT)."""
    max_batch: int = limits.MAX_BATCH
    """The largest batch a sweep may try (MEMORYMARK_MAX_BATCH)."""
    worker_memory_gib: float | None = DEFAULT_WORKER_MEMORY_GIB
    """What each worker process may allocate beyond its libraries; 0 for no ceiling
    (MEMORYMARK_WORKER_MEMORY_GIB)."""
    allow_cpu_backend: bool = False
    """Whether users may run real training steps on the server's CPU
    (MEMORYMARK_ALLOW_CPU_BACKEND)."""
    workers: int | None = None
    """Worker processes; None: one per core (MEMORYMARK_WORKERS)."""
    dask_scheduler: str | None = None
    """A Dask scheduler's address (tcp://host:8786): sweeps then run on that cluster
    (MEMORYMARK_DASK_SCHEDULER)."""
    hosted: bool = False
    """A server shared with strangers (MEMORYMARK_HOSTED): per-visitor history, no server paths,
    no user code, no `cpu` backend; read by `from_sources`, it also sizes the pool for a free
    host (HOSTED_WORKERS, HOSTED_WORKER_MEMORY_GIB) unless the owner set those."""

    def __post_init__(self) -> None:
        if self.hosted:
            # Real training steps in the server's memory are for a server its owner alone uses.
            object.__setattr__(self, "allow_cpu_backend", False)

    @classmethod
    def from_sources(
        cls, env: Mapping[str, str] | None = None, secrets: Mapping[str, Any] | None = None
    ) -> ServerConfig:
        """Read each field from `env` (os.environ by default), else from `secrets`; a bad value
        raises ValueError naming the variable."""
        env = os.environ if env is None else env
        secrets = secrets or {}
        values: dict[str, Any] = {}
        for name, parse in _PARSERS.items():
            var = PREFIX + name.upper()
            raw = env.get(var, secrets.get(var, secrets.get(name)))
            if raw is None or str(raw).strip() == "":
                continue
            try:
                values[name] = parse(str(raw).strip())
            except ValueError:
                raise ValueError(f"{var} has a bad value: {limits.shown(raw)}") from None
        if values.get("hosted"):  # a free host's pool, unless the owner sized it
            values.setdefault("workers", HOSTED_WORKERS)
            values.setdefault("worker_memory_gib", HOSTED_WORKER_MEMORY_GIB)
        return cls(**values)

    @property
    def worker_memory_bytes(self) -> int | None:
        """The workers' memory ceiling in bytes, or None."""
        if not self.worker_memory_gib:
            return None
        return int(self.worker_memory_gib * GIB)

    def apply(self, settings: Settings) -> tuple[Settings, list[str]]:
        """`settings` under the ceilings, and a sentence for each value brought down; ValueError
        (one line) for the cpu backend when the server does not allow it."""
        if settings.hardware.backend == "cpu" and not self.allow_cpu_backend:
            raise ValueError(
                "the cpu backend (real training steps in this server's memory) is off on this "
                "server: choose sim or auto"
            )
        notes, changes = [], {}
        ceilings = (
            self.max_time_limit,
            self.max_probes,
            self.max_batch,
            self.max_ways_out_time_limit,
        )
        units = (" s", " probes", "", " s")
        for name, ceiling, unit in zip(CEILING_FIELDS, ceilings, units, strict=True):
            value = getattr(settings.search, name)
            if value is None or value > ceiling:
                changes[name] = ceiling
                if value is not None:
                    notes.append(f"{name} {value:g}{unit} is above this server's {ceiling:g}{unit}")
        return settings.replace(**changes), notes


def _positive(kind: type) -> Any:
    def parse(raw: str) -> Any:
        value = kind(raw)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(raw)
        return value

    return parse


def _bool(raw: str) -> bool:
    if raw.lower() not in ("1", "0", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(raw)
    return raw.lower() in ("1", "true", "yes", "on")


def _memory(raw: str) -> float | None:
    value = float(raw)
    if not math.isfinite(value) or value < 0:
        raise ValueError(raw)
    return value or None


_PARSERS = {
    "max_time_limit": _positive(float),
    "max_probes": _positive(int),
    "max_ways_out_time_limit": _positive(float),
    "max_batch": _positive(int),
    "worker_memory_gib": _memory,
    "allow_cpu_backend": _bool,
    "workers": _positive(int),
    "dask_scheduler": str,
    "hosted": _bool,
}
