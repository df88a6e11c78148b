"""What the download buttons hand out: the JSON report and a CSV of the probes.

Pure text from a `Report`: no Streamlit. The JSON is exactly `Report.to_dict()` (the same
contract as `memorymark analyze --json`); the CSV has one row per probe, sorted by batch size,
with the columns of `measure --json` (so fields the engine adds later appear by themselves).
"""

from __future__ import annotations

import csv
import io
import json
from typing import Any

from memorymark.measurement import CATEGORIES, Measurement
from memorymark.report import Report


def report_json(report: Report) -> str:
    """The report as indented JSON."""
    return json.dumps(report.to_dict(), indent=2)


def probe_row(m: Measurement) -> dict[str, Any]:
    """`Measurement.to_dict()` (the `measure --json` record) flat: breakdown as `<kind>_bytes`."""
    row = m.to_dict()
    parts = row.pop("breakdown", None) or {}
    row.update({f"{kind}_bytes": parts.get(kind) for kind in CATEGORIES})
    return row


def probes_csv(report: Report) -> str:
    """One row per probe, sorted by batch size, with every field a measurement records."""
    rows = [probe_row(m) for m in sorted(report.measurements, key=lambda m: m.batch_size)]
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def file_stem(report: Report) -> str:
    """`memorymark-bert-A10`: a download's name without extension."""
    gpu = "".join(c if c.isalnum() else "-" for c in report.gpu.name)
    return f"memorymark-{report.settings.model}-{gpu}"
