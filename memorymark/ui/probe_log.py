"""The terminal-style live log: one line per probe, as the prototype's "live terminal view" had.

Pure text from measurements: no Streamlit. Must not know how the sweep chose its batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.report import GIB


def probe_line(m: Measurement, gpu: GPU, seconds: float | None = None) -> str:
    """`[  1.2s] batch  176 fits  20.19 GiB  96%` (% of usable memory), or the OOM's reason."""
    stamp = f"[{seconds:5.1f}s] " if seconds is not None else ""
    if m.fits:
        share = 100 * m.peak_bytes / gpu.usable_bytes
        result = f"fits {m.peak_bytes / GIB:6.2f} GiB {share:3.0f}%"
    else:
        result = f"OOM  {m.error or 'out of memory'}"
    return f"{stamp}batch {m.batch_size:>4} {result}"


def log_text(
    header: str,
    measurements: Sequence[Measurement],
    gpu: GPU,
    seconds: Sequence[float] | None = None,
    footer: str | None = None,
) -> str:
    """The whole log: a `$` header, a legend, one line per probe in the order tried, a footer."""
    stamps: Sequence[float | None] = seconds if seconds is not None else [None] * len(measurements)
    lines = [f"$ {header}", "# peak of one full training step; % of usable memory"]
    lines += [probe_line(m, gpu, s) for m, s in zip(measurements, stamps, strict=False)]
    if footer:
        lines.append(footer)
    return "\n".join(lines)
