"""What the download buttons hand out: the JSON report, a CSV of the probes, a Markdown page.

The text and file names are memorymark/reporting/exports.py's (the CLI exports the same); this
module only names them for the pages. No Streamlit.
"""

from __future__ import annotations

from memorymark.reporting.exports import (
    file_name,
    file_stem,
    markdown,
    probe_row,
    probes_csv,
    report_json,
)

__all__ = ["file_name", "file_stem", "markdown", "probe_row", "probes_csv", "report_json"]
