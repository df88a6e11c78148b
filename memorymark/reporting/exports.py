"""What a finished analysis is exported as: JSON, a CSV of its probes, a Markdown page, and the
file names they are saved under.

The app's download buttons and the CLI (`analyze --format`, `history export`) hand out the same
text from here. Each carries the environment stamp (versions, backend, device, time): the JSON
as its `environment` object, the CSV as columns on every row (a comment line would break CSV
readers), the Markdown as a paragraph. File names carry the model, the GPU, the key settings
and the time, slugged to characters every filesystem accepts. No torch, no Streamlit, no I/O.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import re
from typing import Any

from memorymark.environment import stamp, utc_now
from memorymark.measurement import CATEGORIES, Measurement
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.markdown import report_markdown

EXPORT_FORMATS = {"json": "json", "csv": "csv", "markdown": "md"}
"""Export formats and their file extensions."""
# The stamp's fields that every probe row already has under its own name.
_ROW_HAS = ("backend", "memory_source")
_PART_CHARS = 40


def stamped(report: Report) -> Report:
    """The report with its stamp; one made now when it was built without one (by hand)."""
    if report.stamp is not None:
        return report
    made = stamp(backend=report.backend, device=report.gpu.name, memory_source=report.memory_source)
    return dataclasses.replace(report, stamp=made)


def environment(report: Report) -> dict[str, str]:
    """The report's environment stamp as JSON keys."""
    return stamped(report).stamp.to_dict()  # type: ignore[union-attr]


def report_json(report: Report) -> str:
    """The `analyze --json` object, indented, with its `environment` stamp."""
    return json.dumps(report_to_dict(stamped(report)), indent=2)


def markdown(report: Report, data: dict[str, Any] | None = None) -> str:
    """The one-page Markdown report (memorymark/reporting/markdown.py), with its stamp; `data`
    is the report's `analyze --json` object when the caller has built it already."""
    if report.stamp is None:  # stamped now, so a dict built before lacks the stamp
        return report_markdown(stamped(report))
    return report_markdown(report, data)


def probe_row(m: Measurement) -> dict[str, Any]:
    """`Measurement.to_dict()` (the `measure --json` record) flat: breakdown as `<kind>_bytes`."""
    row = m.to_dict()
    parts = row.pop("breakdown", None) or {}
    row.update({f"{kind}_bytes": parts.get(kind) for kind in CATEGORIES})
    return row


def probes_csv(report: Report) -> str:
    """One row per probe, sorted by batch size, with every field a measurement records, then
    the model and the environment stamp (the same on every row)."""
    env = {k: v for k, v in environment(report).items() if k not in _ROW_HAS}
    rows = [
        {**probe_row(m), "model": report.settings.workload.model, **env}
        for m in sorted(report.measurements, key=lambda m: m.batch_size)
    ]
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def export_text(report: Report, fmt: str) -> str:
    """The report in one of EXPORT_FORMATS."""
    if fmt == "json":
        return report_json(report) + "\n"
    if fmt == "csv":
        return probes_csv(report)
    if fmt == "markdown":
        return markdown(report)
    raise ValueError(f"unknown export format {fmt!r}; choose {', '.join(EXPORT_FORMATS)}")


def slug(text: str) -> str:
    """`text` as a file-name part: letters, digits and dots; anything else one dash."""
    part = re.sub(r"[^A-Za-z0-9.]+", "-", text)
    part = re.sub(r"[-.]*\.[-.]*", ".", part).strip("-.")  # never "..", never "-."
    return part[:_PART_CHARS].strip("-.") or "x"


def file_stem(report: Report) -> str:
    """`memorymark-bert-A10-32-true-seq128-bs16-20260102T030405Z`: model, GPU, precision, sequence
    length (or image size), current batch and the time the analysis ended."""
    s = report.settings
    size = (
        f"img{s.workload.image_size}"
        if s.workload.resolved_task == "image-classification"
        else f"seq{s.workload.seq_len}"
    )
    when = (environment(report)["finished_utc"] or utc_now()).replace("-", "").replace(":", "")
    parts = [
        s.workload.model,
        report.gpu.name,
        s.workload.precision,
        size,
        f"bs{s.search.current_batch}",
        when,
    ]
    return "memorymark-" + "-".join(slug(p) for p in parts)


def file_name(report: Report, fmt: str) -> str:
    """`file_stem` with the format's extension."""
    return f"{file_stem(report)}.{EXPORT_FORMATS[fmt]}"
