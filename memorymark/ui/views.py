"""How the main page shows a sweep: the live panel while it runs, the final panel once it is done.

Owns the Streamlit layout of a sweep (memory chart and throughput chart side by side, progress,
terminal log) and the wording of errors with their next step. Reads `SweepJob` and `Report`;
must not start, stop or time sweeps itself (that is `sweep_runner`'s job), and leaves the
results below the panel to `results`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import streamlit as st

from memorymark.fit import FitPolicy
from memorymark.gpus import GPU
from memorymark.measurement import Measurement, is_measured
from memorymark.measurement import memory_source as source_of
from memorymark.report import Report
from memorymark.settings import Costs, Settings
from memorymark.ui import charts, probe_log, sidebar, sweep_runner, takeaway, throughput_chart
from memorymark.ui.literal import literal
from memorymark.ui.sweep_runner import SweepJob, sweep_progress
from memorymark.units import plural
from memorymark.ways_out import Fix

REDRAW_SECONDS = 0.5
FIGURES_KEY = "mm_sweep_figures"
"""The last charts this session drew, with what they were built from (see `sweep_panel`)."""
LOG_HEIGHT = 220
# What each state of a job is doing, for the progress bar.
STATE_WORDS = {
    "queued": "Queued",
    "starting": "Starting a worker",
    "waiting": "Waiting",
    "running": "Sweeping",
    "fixing": "Nothing fits: simulating what would (checkpointing, bf16, LoRA, a bigger GPU)",
}
FIRST_START_WORDS = (
    "Starting a worker: the first analysis after a server start waits while the workers load "
    "PyTorch and the model code (once per server, up to half a minute on a small machine)"
)
"""The bar while the first sweep of a server waits for the worker pool's warm-up."""
FIRST_TRACE_WORDS = "Building the model and tracing its first training step"
"""The bar while a sweep runs with no probe yet: the first one builds the model too."""
FLAG_WIDGETS = {  # a CLI flag the engine's one-line refusals name -> the widget that sets it
    "--precision": "Precision",
    "--attention": "Attention",
    "--backend": "Backend (Advanced)",
    "--checkpointing": "Activation checkpointing",
}
NEXT_STEPS = (  # (any of these words, and any of these too, or none needed) -> the next step
    (("unknown model",), (), "pick a model from the list, or check the spec's spelling."),
    (
        ("bf16",),
        ("no bf16",),
        "set Precision to 16-mixed or 32-true in the sidebar, or pick a GPU with bf16.",
    ),  # fmt: skip
    (("gpu",), ("unknown", "sees no"), "pick another GPU, or set Backend to sim under Advanced."),
    (("seq_len", "position"), (), "lower the sequence length in the sidebar."),
    (("lora",), (), "name the modules to adapt in 'LoRA target modules', or set the rank to 0."),
    (
        ("checkpointing",),
        (),
        "set Activation checkpointing to none (or full), or pick another model.",
    ),  # fmt: skip
    (("hub",), (), "download the model's config.json and upload it in the sidebar instead."),
    (("config file", "model_type"), (), "upload a transformers config.json (it has a model_type)."),
    (("not usable here",), (), "install that library next to torch, or pick a catalog model."),
    (("margin",), (), 'write the margin as "2%" or "512MiB" (Advanced).'),
    (("step", "max_batch"), (), "under Advanced, make the largest batch at least the step."),
    (
        ("time limit",),
        (),
        "raise the time limit under Advanced (up to this server's ceiling), "
        "or pick a smaller model.",
    ),  # fmt: skip
    (
        ("memory its worker",),
        (),
        "pick a smaller model or sequence length: this server caps each sweep's memory.",
    ),  # fmt: skip
)


def next_step(error: str) -> str:
    """What to do about a failed run, by what its message says."""
    text = error.lower()
    for words, also, step in NEXT_STEPS:
        if any(w in text for w in words) and (not also or any(a in text for a in also)):
            return step
    return "check the settings in the sidebar, or try a smaller model to see whether it runs."


def app_words(error: str) -> str:
    """The engine's message with each CLI flag it names put as the sidebar widget that sets it
    (`use --precision 16-mixed` -> `set Precision to 16-mixed`): the app has no flags."""
    for flag, widget in FLAG_WIDGETS.items():
        error = re.sub(rf"\buse {flag} (\S+)", rf"set {widget} to \1", error)
        error = error.replace(flag, widget)
    return error


def show_error(error: str) -> None:
    """An st.error with the message (in the app's words) and a next step: never a traceback."""
    shown = literal(app_words(error))
    st.error(f"The analysis failed: {shown}\n\nNext step: {next_step(error)}")


def header(settings: Settings, gpu: GPU, backend: str | None) -> str:
    """The log's `$` line: the CLI command that runs these very settings, and where it runs."""
    how = "measured" if is_measured(backend) else (backend or "sim")
    return f"{settings.to_command_line()}  # {gpu.name}, {how}, {settings.search.strategy}"


def sweep_panel(
    settings: Settings,
    gpu: GPU,
    measurements: Sequence[Measurement],
    *,
    memory_source: str,
    log: str,
    optimal: Measurement | None = None,
    knee_batch: int | None = None,
) -> None:
    """Memory and throughput charts of every probe side by side, the terminal-style log below."""
    memory_col, speed_col = st.columns(2)
    # A running sweep redraws every REDRAW_SECONDS, mostly with nothing new: building the two
    # figures takes about 65 ms of the server's CPU (plotly's validation), drawing built ones 5.
    signature = (settings, gpu, tuple(measurements), memory_source, optimal, knee_batch)
    built = st.session_state.get(FIGURES_KEY)
    if built is None or built[0] != signature:
        built = (signature, _figures(settings, gpu, measurements, memory_source, optimal,
                                     knee_batch))  # fmt: skip
        st.session_state[FIGURES_KEY] = built
    fig, speed = built[1]
    memory_col.plotly_chart(fig, key="sweep_chart", width="stretch")
    speed_col.plotly_chart(speed, key="throughput_chart", width="stretch")
    st.caption("Live log")
    st.code(log, language=None, height=LOG_HEIGHT, wrap_lines=True)


def _figures(
    settings: Settings,
    gpu: GPU,
    measurements: Sequence[Measurement],
    memory_source: str,
    optimal: Measurement | None,
    knee_batch: int | None,
) -> tuple[Any, Any]:
    """The memory chart and the throughput chart of these probes."""
    fig = charts.sweep_figure(
        measurements,
        gpu,
        memory_source=memory_source,
        max_batch=settings.search.max_batch,
        optimal=optimal,
        limit_bytes=FitPolicy.on(settings, gpu).limit_bytes,
    )
    speed = throughput_chart.throughput_figure(
        measurements,
        gpu,
        x_range=charts.axis_ranges(measurements, gpu, settings.search.max_batch)[0],
        current_batch=settings.search.current_batch,
        optimal_batch=optimal.batch_size if optimal else None,
        knee_batch=knee_batch,
    )
    return fig, speed


def progress_words(job: SweepJob) -> str:
    """What a running job waits for, in words: "Starting (0 probes)" for seconds said nothing."""
    if job.state == "starting" and not job.measurements and not sweep_runner.workers_warm():
        return FIRST_START_WORDS
    if job.state == "running" and not job.measurements:
        return FIRST_TRACE_WORDS
    if job.state == "reporting" and job.stage:
        # After the last probe: what the report checks (a plan, the eval batch) in words.
        return f"Last probe done; {job.stage}"
    label = STATE_WORDS.get(job.state, job.state.capitalize())
    if job.state == "fixing":
        return f"{label}: {plural(len(job.fixes), 'way out', 'ways out')} found so far"
    return label


def _draw_job(job: SweepJob, costs: Costs | None = None) -> None:
    ms, secs = list(job.measurements), list(job.probe_seconds)
    stamps = secs if len(secs) == len(ms) else None  # a re-plan shows the cached sweep's probes
    if job.state == "queued" and job.queue_position:
        ahead = job.queue_position - 1
        st.info(
            f"Queued: number {job.queue_position} in line "
            f"({ahead} sweep{'s' if ahead != 1 else ''} of other sessions wait ahead of yours, "
            "besides those running). It starts as soon as a worker is free."
        )
    if job.state == "waiting":
        st.info(
            "Waiting for the GPU: another session is measuring on it. This sweep starts "
            "as soon as that one ends (real-GPU sweeps run one at a time)."
        )
    took = f"{plural(len(ms), 'probe')}, {job.elapsed_seconds:.1f} s"
    if job.running:
        st.progress(
            sweep_progress(ms, job.settings.search.step), text=f"{progress_words(job)} ({took})"
        )
    elif job.state == "done":
        st.progress(1.0, text=f"Done ({took})")
    else:
        # No bar for a failed or cancelled job: a full one reads as success.
        st.caption(f"{job.state.capitalize()} after {took}.")
    if job.gpu is None:
        return
    real = any(m.measured for m in ms) or (not ms and is_measured(job.backend_name))
    source = source_of(real)
    footer = {"cancelled": "cancelled.", "failed": f"failed: {job.error}"}.get(job.state)
    log = probe_log.log_text(
        header(job.settings, job.gpu, job.backend_name), ms, job.gpu, stamps, footer
    )
    sweep_panel(job.settings, job.gpu, ms, memory_source=source, log=log)
    if job.fixes or job.state == "fixing":
        _ways_out_so_far(job, costs or Costs())


def _ways_out_so_far(job: SweepJob, costs: Costs) -> None:
    """The ways out the worker found so far (nothing fit), each with its button."""
    gpu = job.gpu

    def price(fix: Fix) -> float | None:  # the user's price is for the GPU they chose
        return costs.usd_per_hour if gpu is not None and fix.gpu.name == gpu.name else None

    not_finished = job.fixes_not_finished if job.running else ()
    takeaway.ways_out_so_far(job.fixes, not_finished, price)


def live_sweep(job: SweepJob, costs: Costs | None = None) -> None:
    """Draw the job; while it runs a fragment redraws it every REDRAW_SECONDS, then reruns the app
    (as it does when a way out found so far is applied: the page starts that analysis).
    `costs` price the ways out found so far."""
    polling = job.running

    @st.fragment(run_every=REDRAW_SECONDS if polling else None)
    def _panel() -> None:
        if (polling and not job.running) or sidebar.analysis_pending():
            st.rerun()  # the sweep ended: a full run draws the results and re-enables Analyze
        _draw_job(job, costs)

    _panel()


def finished_sweep(report: Report, job: SweepJob | None, *, saved_utc: str | None = None) -> None:
    """The final charts and log of a finished report (timings too when this session ran it; a
    result from the cache, or one reopened from the history saved at `saved_utc`, says so, and
    that its time is the first run's)."""
    ran_here = job is not None and job.report is report
    n, took = len(report.measurements), report.elapsed_seconds
    secs = job.probe_seconds if job and ran_here and len(job.probe_seconds) == n else None
    swept_here = secs is not None
    best = f"optimal batch {report.optimal.batch_size}" if report.optimal else "no batch fits"
    probes = plural(n, "probe")
    footer = f"done: {best} ({probes}, {took:.1f} s)"
    if report.fixes_stopped_by:
        found = plural(len(report.fixes), "way out", "ways out")
        footer += f"; ways out: {found}, the search stopped at {report.fixes_stopped_by}"
    if ran_here and not swept_here:
        footer = f"re-planned from the cached sweep: {best} ({probes}, not run again)"
    elif not ran_here:
        where = "cached" if saved_utc is None else f"saved {saved_utc}"
        footer = f"{where}: {best} ({probes}, {took:.1f} s when first run; not run again)"
    # Laid out as the live panel is (one container: a status line, the charts, the log), so
    # each part takes the place of its live one. Drawn loose, the charts replaced the live
    # fragment's container and its log stayed in it, greyed, as a second "Live log" until
    # the results below had rendered.
    with st.container():
        if ran_here:
            st.progress(1.0, text=f"Done ({probes}, {took:.1f} s)")
        else:
            st.caption(f"{footer[0].upper()}{footer[1:]}.")
        _finished_panel(report, secs, footer)


def _finished_panel(report: Report, secs: list[float] | None, footer: str) -> None:
    log = probe_log.log_text(
        header(report.settings, report.gpu, report.backend),
        report.measurements,
        report.gpu,
        secs,
        footer,
    )
    knee = report.knee()
    sweep_panel(
        report.settings,
        report.gpu,
        report.measurements,
        memory_source=report.memory_source,
        log=log,
        optimal=report.optimal,
        knee_batch=knee.batch_size if knee else None,
    )
