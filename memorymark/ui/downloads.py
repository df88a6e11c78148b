"""What the download buttons hand out: the JSON report and a CSV of the probes.

Pure text from a `Report`: no Streamlit. The JSON is exactly `Report.to_dict()` (the same
contract as `memorymark analyze --json`); the CSV has one row per probe, sorted by batch size.
"""

from __future__ import annotations

import csv
import io
import json

from memorymark.measurement import CATEGORIES
from memorymark.report import Report, gib

CSV_COLUMNS = (
    "batch_size", "fits", "peak_bytes", "peak_gib", "reserved_bytes", "step_seconds",
    "backend", "memory_source", *(f"{c}_bytes" for c in CATEGORIES), "error",
)  # fmt: skip


def report_json(report: Report) -> str:
    """The report as indented JSON."""
    return json.dumps(report.to_dict(), indent=2)


def probes_csv(report: Report) -> str:
    """One row per probe: batch, fit or OOM, peak bytes and GiB, breakdown bytes, error."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for m in sorted(report.measurements, key=lambda m: m.batch_size):
        parts = m.breakdown.to_dict() if m.breakdown else {}
        writer.writerow([
            m.batch_size, m.fits, m.peak_bytes, gib(m.peak_bytes), m.reserved_bytes,
            m.step_seconds, m.backend, "measured" if m.measured else "simulated",
            *(parts.get(c, "") for c in CATEGORIES), m.error or "",
        ])  # fmt: skip
    return out.getvalue()


def file_stem(report: Report) -> str:
    """`memorymark-bert-A10`: a download's name without extension."""
    gpu = "".join(c if c.isalnum() else "-" for c in report.gpu.name)
    return f"memorymark-{report.settings.model}-{gpu}"
