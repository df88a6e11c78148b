"""A step that is not recommended says why wherever its figure sits below the limit: the
Longest sequence page's lines and table, the CLI's probe lines, the main page's live log.

The case a user hit: Llama-3.1-8B QLoRA on an A10 (21.25 GiB limit), 10,240 tokens "fits,
needs 20.95 GiB" beside 11,264 tokens "does not fit, needs 19.43 GiB": the longer step needed
a cache flush, which the fit rule refuses for a recommended size, and only the log said so.
"""

from __future__ import annotations

import dataclasses

from app_samples import A10

from memorymark.cli import render
from memorymark.measurement import Measurement
from memorymark.search.seq_len import SeqLenAnswer
from memorymark.settings import Settings
from memorymark.ui import probe_log, tables
from memorymark.units import GIB

USABLE = A10.usable_bytes


def step(
    n: int, *, fits: bool, runs: bool, required_gib: float | None, **kw: object
) -> Measurement:
    """A simulated step at `n` whose reserved need is `required_gib` (None: unknown)."""
    required = None if required_gib is None else int(required_gib * GIB)
    return Measurement(
        batch_size=n, fits=fits, runs=runs, peak_bytes=int(18 * GIB), backend="sim",
        measured=False, required_bytes=required, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


FITS = step(10_240, fits=True, runs=True, required_gib=20.95)
FLUSHED = step(11_264, fits=False, runs=True, required_gib=19.43, alloc_retries=2)
RAN_OUT = step(11_264, fits=False, runs=False, required_gib=19.43, alloc_retries=1)
RAISED = step(11_264, fits=False, runs=False, required_gib=None)
PAST = step(12_288, fits=False, runs=False, required_gib=23.9)
MARGIN = step(10_752, fits=False, runs=True, required_gib=21.5)


def test_each_kind_of_not_fitting_has_its_reason_and_figure() -> None:
    assert FITS.why_not(USABLE) is None
    assert FLUSHED.why_not(USABLE) == "needs a cache flush (allocation retry) at 19.43 GiB"
    assert RAN_OUT.why_not(USABLE) == (
        "ran out of memory after a cache flush (allocation retry): fragmented, though it "
        "needs 19.43 GiB"
    )
    assert RAISED.why_not(USABLE) == "ran out of memory after 18.00 GiB allocated"
    assert PAST.why_not(USABLE) == "needs 23.90 GiB"
    assert MARGIN.why_not(USABLE) == "inside the margin at 21.50 GiB"


def test_a_longest_sequence_line_below_the_limit_says_why_it_does_not_fit() -> None:
    assert tables.seq_len_line((10_240, FITS), USABLE).startswith("10,240 tokens: fits, peak")
    line = tables.seq_len_line((11_264, FLUSHED), USABLE)
    assert line.startswith("11,264 tokens: runs, not recommended, needs a cache flush")
    assert "at 19.43 GiB (simulated)" in line
    line = tables.seq_len_line((11_264, RAN_OUT), USABLE)
    assert line.startswith("11,264 tokens: does not fit, ran out of memory after a cache flush")
    assert tables.seq_len_line((12_288, PAST), USABLE).startswith(
        "12,288 tokens: does not fit, needs 23.90 GiB (simulated)"
    )


def test_the_longest_sequence_table_has_a_why_not_column() -> None:
    answer = SeqLenAnswer(
        settings=Settings(model="llama-3.1-8b"), batch_size=1,
        probes=((10_240, FITS), (11_264, FLUSHED), (12_288, PAST)), search_cap=131_072,
        gpu_name=A10.name, gpu_total_bytes=A10.total_bytes, usable_bytes=USABLE,
        memory_source="simulated", elapsed_seconds=1.0,
    )  # fmt: skip
    rows = {row["Sequence length"]: row for row in tables.seq_len_table(answer)}
    assert rows[10_240]["Why not"] == ""
    assert rows[11_264]["Why not"] == "needs a cache flush (allocation retry) at 19.43 GiB"
    assert rows[11_264]["Needs (GiB, simulated)"] == 19.43
    assert rows[12_288]["Why not"] == "needs 23.90 GiB"


def test_the_cli_probe_line_never_shows_a_bare_need_below_the_capacity() -> None:
    line = render.seq_probe_line(11_264, RAN_OUT, USABLE)
    assert line.startswith("  seq   11264  OOM ")
    assert "(ran out of memory after a cache flush (allocation retry): fragmented" in line
    assert "needs 19.4 GiB of" not in line  # the bare figure that read as a fit
    assert "(ran out of memory after 18.00 GiB allocated)" in render.probe_line(RAISED, USABLE)
    assert f"needs 23.9 GiB of {USABLE / GIB:.1f}" in render.seq_probe_line(12_288, PAST, USABLE)
    assert render.seq_probe_line(11_264, FLUSHED, USABLE).endswith("(after a cache flush)")


def test_the_live_log_says_why_a_step_ran_out_below_the_capacity() -> None:
    ran_out = dataclasses.replace(RAN_OUT, batch_size=40)
    assert probe_log.probe_line(ran_out, A10) == (
        "batch   40 OOM, ran out of memory after a cache flush (allocation retry): fragmented, "
        "though it needs 19.43 GiB"
    )
