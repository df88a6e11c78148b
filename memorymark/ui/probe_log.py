"""The terminal-style live log: one line per probe, as the prototype's "live terminal view" had.

Pure text from measurements: no Streamlit. Must not know how the sweep chose its batch sizes.
"""

from __future__ import annotations

from collections.abc import Sequence

from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.units import GIB


def probe_line(m: Measurement, gpu: GPU, seconds: float | None = None) -> str:
    """`[  1.2s] batch  176 fits  20.19 GiB  96%` (peak; % of usable memory the step holds),
    `runs` for a batch inside the margin or one that needed a cache flush, or `OOM, needs
    38.6 GiB of 21.6` for one past it (why, for one that ran out below it; the OOM's reason when
    the need is unknown: a real device stops at its limit)."""
    stamp = f"[{seconds:5.1f}s] " if seconds is not None else ""
    held = m.required_bytes if m.required_bytes is not None else m.peak_bytes
    if m.runs:
        share = 100 * held / gpu.usable_bytes
        verdict = "fits" if m.fits else "runs"
        result = f"{verdict} {m.peak_bytes / GIB:6.2f} GiB {share:3.0f}%"
        if m.held_back:
            result += f" ({m.held_back})"
    elif m.required_bytes is not None and m.required_bytes > gpu.usable_bytes:
        result = f"OOM, needs {m.required_bytes / GIB:.1f} GiB of {gpu.usable_bytes / GIB:.1f}"
    elif m.required_bytes is not None:
        # Below the capacity, a bare "needs" figure would read as a fit: say why it failed.
        result = f"OOM, {m.why_not(gpu.usable_bytes)}"
    else:
        result = f"OOM  {m.error or 'out of memory'}"
    replayed = " [replayed]" if m.replayed else ""
    return f"{stamp}batch {m.batch_size:>4} {result}{replayed}"


def log_text(
    header: str,
    measurements: Sequence[Measurement],
    gpu: GPU,
    seconds: Sequence[float] | None = None,
    footer: str | None = None,
) -> str:
    """The whole log: a `$` header, a legend, one line per probe in the order tried, a footer."""
    stamps: Sequence[float | None] = seconds if seconds is not None else [None] * len(measurements)
    lines = [f"$ {header}", "# peak of one full training step; % of usable memory it holds"]
    lines += [probe_line(m, gpu, s) for m, s in zip(measurements, stamps, strict=False)]
    if footer:
        lines.append(footer)
    return "\n".join(lines)
