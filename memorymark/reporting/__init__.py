"""Reporting: a finished `Report` as the forms people and tools read.

Owns the `analyze --json` contract (`json_form`), the Markdown page (`markdown`), the saved
record that reopens a report (`record`), downloads (`exports`), and ready-to-paste training code
(`snippets`).

Must not know: torch, how anything was measured, or Streamlit. It computes nothing the report
has not.
"""
