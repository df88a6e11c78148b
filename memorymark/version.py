"""MemoryMark's own version, in one place that imports nothing (pyproject.toml repeats it)."""

__version__ = "0.1.0"
