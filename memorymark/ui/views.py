"""How the main page shows a sweep: the live panel while it runs, the results once it is done.

Owns the Streamlit layout of a sweep (chart, progress, terminal log, metric cards, bars,
verdict, downloads) and the wording of errors with their next step. Reads `SweepJob` and
`Report`; must not start, stop or time sweeps itself (that is `sweep_runner`'s job).
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from memorymark.devices import capacity_bytes
from memorymark.gpus import GPU
from memorymark.measurement import Measurement
from memorymark.report import GIB, Report
from memorymark.settings import Settings
from memorymark.ui import charts, downloads, probe_log
from memorymark.ui.sweep_runner import SweepJob, sweep_progress

POLL_SECONDS = 0.5
LOG_HEIGHT = 360


def next_step(error: str) -> str:
    """What to do about a failed run, by what its message says."""
    text = error.lower()
    if "gpu" in text and ("unknown" in text or "sees no" in text):
        return "pick another GPU, or set Backend to sim under Advanced."
    if "seq_len" in text or "position" in text:
        return "lower the sequence length in the sidebar."
    if "step" in text or "max_batch" in text:
        return "make the largest batch to try at least the batch step (Advanced)."
    return "check the settings in the sidebar, or try a smaller model to see whether it runs."


def show_error(error: str) -> None:
    """An st.error with the message and a next step: never a traceback."""
    st.error(f"The analysis failed: {error}\n\nNext step: {next_step(error)}")


def header(settings: Settings, gpu: GPU, backend: str | None) -> str:
    """The log's `$` line: what runs where."""
    how = "measured" if backend in ("cuda", "mps") else (backend or "sim")
    return f"memorymark analyze {settings.model} --gpu '{gpu.name}' ({how}, {settings.strategy})"


def sweep_panel(
    settings: Settings,
    gpu: GPU,
    measurements: Sequence[Measurement],
    *,
    memory_source: str,
    log: str,
    optimal: Measurement | None = None,
) -> None:
    """The chart of every probe next to the terminal-style log."""
    chart_col, log_col = st.columns([3, 2])
    fig = charts.sweep_figure(
        measurements,
        gpu,
        memory_source=memory_source,
        max_batch=settings.max_batch,
        optimal=optimal,
        limit_bytes=capacity_bytes(settings, gpu),
    )
    chart_col.plotly_chart(fig, key="sweep_chart", width="stretch")
    with log_col:
        st.caption("Live log")
        st.code(log, language=None, height=LOG_HEIGHT, wrap_lines=True)


def _draw_job(job: SweepJob) -> None:
    ms, secs = list(job.measurements), list(job.probe_seconds)
    if job.state == "waiting":
        st.info(
            "Waiting for the GPU: another session is measuring on it. This sweep starts "
            "as soon as that one ends (real-GPU sweeps run one at a time)."
        )
    progress = 1.0 if not job.running else sweep_progress(ms, job.settings.step)
    what = {"starting": "Starting", "waiting": "Waiting", "running": "Sweeping"}
    label = what.get(job.state, job.state.capitalize())
    st.progress(progress, text=f"{label}: {len(ms)} probes, {job.elapsed_seconds:.1f} s")
    if job.gpu is None:
        return
    real = any(m.measured for m in ms) or (not ms and job.backend_name in ("cuda", "mps"))
    source = "measured" if real else "simulated"
    footer = {"cancelled": "cancelled.", "failed": f"failed: {job.error}"}.get(job.state)
    log = probe_log.log_text(
        header(job.settings, job.gpu, job.backend_name), ms, job.gpu, secs, footer
    )
    sweep_panel(job.settings, job.gpu, ms, memory_source=source, log=log)


def live_sweep(job: SweepJob) -> None:
    """Draw the job; while it runs a fragment redraws it every POLL_SECONDS, then reruns the app."""
    polling = job.running

    @st.fragment(run_every=POLL_SECONDS if polling else None)
    def _panel() -> None:
        if polling and not job.running:
            st.rerun()  # the sweep ended: a full run draws the results and re-enables Analyze
        _draw_job(job)

    _panel()


def finished_sweep(report: Report, job: SweepJob | None) -> None:
    """The final chart and log of a finished report (timings too when this session ran it)."""
    secs = job.probe_seconds if job is not None and job.report is report else None
    backend = report.backend
    n, took = len(report.measurements), report.elapsed_seconds
    best = f"optimal batch {report.optimal.batch_size}" if report.optimal else "no batch fits"
    footer = f"done: {best} ({n} probes, {took:.1f} s)"
    log = probe_log.log_text(
        header(report.settings, report.gpu, backend), report.measurements, report.gpu, secs, footer
    )
    sweep_panel(
        report.settings,
        report.gpu,
        report.measurements,
        memory_source=report.memory_source,
        log=log,
        optimal=report.optimal,
    )


def speedup_source(report: Report) -> str:
    """How the speedup (and so the savings) was obtained, in words for a label."""
    if report.speedup_source == "throughput":
        return f"{report.throughput_source or 'estimated'} throughput"
    return "est. from batch ratio"


def metric_cards(report: Report) -> list[tuple[str, str, str]]:
    """(label, value, help) of the six cards; every memory label says measured or simulated."""
    optimal, current = report.optimal, report.current
    src, gpu, ratio = report.memory_source, report.gpu, report.speedup
    fits = current is not None and current.fits
    return [
        ("Optimal batch size", str(optimal.batch_size) if optimal else "none",
         f"The largest batch that trains on {gpu.name} ({src})"),
        (f"Memory at batch {report.settings.current_batch} ({src})",
         charts.gib_text(current.peak_bytes) if fits else "OOM",
         f"Peak of a full training step; {gpu.usable_gib:.2f} GiB usable"),
        (f"Memory at the optimal batch ({src})",
         charts.gib_text(optimal.peak_bytes) if optimal else "n/a",
         f"of {gpu.usable_gib:.2f} GiB usable, {gpu.total_gib:.2f} GiB total"),
        ("Usable memory wasted", f"{report.waste_percent:.1f}%",
         f"{report.waste_bytes / GIB:.2f} GiB left idle by the current batch"),
        (f"Speedup ({speedup_source(report)})", f"{ratio:.1f}x" if ratio else "n/a",
         "samples/s at the optimal batch over the current one; without a throughput, the "
         "batch ratio (the speedup if throughput grew with batch size)"),
        ("Annual savings (estimated)", f"${report.cost_savings_annual:,.0f}",
         f"of ${report.annual_cost_usd:,.0f}/year at ${report.usd_per_hour:.2f}/h"),
    ]  # fmt: skip


def _metrics(report: Report) -> None:
    columns = [*st.columns(3), *st.columns(3)]
    for column, (label, value, help_text) in zip(columns, metric_cards(report), strict=True):
        column.metric(label, value, border=True, help=help_text)


def _downloads(report: Report) -> None:
    stem = downloads.file_stem(report)
    left, right, _ = st.columns([1, 1, 3])
    left.download_button(
        "Download JSON report",
        downloads.report_json(report),
        file_name=f"{stem}.json",
        mime="application/json",
        on_click="ignore",
        key="download_json",
    )
    right.download_button(
        "Download probes CSV",
        downloads.probes_csv(report),
        file_name=f"{stem}.csv",
        mime="text/csv",
        on_click="ignore",
        key="download_csv",
    )


def results(report: Report) -> None:
    """Metric cards, verdict, current-vs-optimal bars, breakdown and downloads."""
    if report.optimal is None:
        st.error(
            f"{report.verdict()}\n\nNext step: pick a GPU with more memory, a shorter "
            "sequence or smaller images, or the sgd / none optimizer."
        )
    elif not report.current_fits:
        st.warning(report.verdict())
    else:
        st.success(report.verdict())
    if report.capped:
        st.info(
            f"Every batch up to {report.settings.max_batch} fits: raise 'Largest batch to "
            "try' under Advanced to search further."
        )
    _metrics(report)
    left, right = st.columns(2)
    left.plotly_chart(charts.capacity_bars(report), key="capacity_bars", width="stretch")
    if report.optimal is not None and report.optimal.breakdown is not None:
        fig = charts.breakdown_bar(
            report.optimal.breakdown,
            batch_size=report.optimal.batch_size,
            memory_source=report.memory_source,
        )
        right.plotly_chart(fig, key="breakdown_bar", width="stretch")
    st.caption(
        f"Memory {charts.source_label(report.memory_source)} on {report.gpu.name}; "
        f"speedup and savings: {speedup_source(report)}. "
        f"{len(report.measurements)} probes in {report.elapsed_seconds:.1f} s."
    )
    _downloads(report)
