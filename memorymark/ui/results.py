"""The main page's results once a sweep is done: verdict, metric cards, bars, which memory number
is which, throughput in words, downloads, then what to take to the training script.

Owns the layout and wording of a finished `Report` (every memory figure says simulated or
measured, every speedup says estimated or measured). Must not run anything: the report holds
every number, fixes included.
"""

from __future__ import annotations

import streamlit as st

from memorymark.measurement import Measurement
from memorymark.report import KNEE_FRACTION, Report
from memorymark.reporting import exports
from memorymark.reporting.markdown import escape
from memorymark.step import paging
from memorymark.ui import charts, tables, takeaway
from memorymark.ui.throughput_chart import source_words
from memorymark.units import GIB, gib_text, plural

SPEEDUP_HELP = (
    "Training samples per second at the optimal batch over the current batch: estimated from "
    "FLOPs and bytes on the GPU's roofline when simulated, timed when measured. The batch ratio "
    "(optimal / current batch) would be the speedup only if throughput grew with batch size."
)


def speedup_source(report: Report) -> str:
    """How the speedup (and so the savings) was obtained, in words for a label."""
    if report.optimal is not None and not report.current_fits:
        return "the current batch crashes"
    if report.speedup_source == "throughput":
        return f"{report.throughput_source or 'estimated'} throughput"
    if report.speedup_source is None:
        return "no batch fits"
    return "batch ratio: throughput not known"


def _times(ratio: float | None) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.1f}x" if ratio >= 10 else f"{ratio:.2f}x"


def metric_cards(report: Report) -> list[tuple[str, str, str, str | None]]:
    """(label, value, help, delta) of the six cards; memory labels say measured or simulated.

    A current batch that crashes gets no waste, speedup or savings: nothing ran to compare."""
    optimal, current, maximum = report.optimal, report.current, report.max_fit
    src, gpu = report.memory_source, report.gpu
    ran = current is not None and bool(current.runs)
    crashed = "n/a"
    why = None if ran or current is None else "the current batch crashes"
    by_throughput = report.speedup_source == "throughput"
    above = maximum is not None and optimal is not None and maximum.batch_size > optimal.batch_size
    savings = report.cost_savings_annual
    return [
        ("Optimal batch size", str(optimal.batch_size) if optimal else "none",
         f"The largest batch that trains on {gpu.name} ({src}) and leaves the margin free",
         f"max {maximum.batch_size} with no margin" if maximum and above else None),
        (f"Memory at batch {report.settings.search.current_batch} ({src})",
         gib_text(current.peak_bytes) if current and ran else "OOM",
         f"Peak of a full training step; {gpu.usable_gib:.2f} GiB usable"
         + _needs(report), None),
        (f"Memory at the optimal batch ({src})",
         gib_text(optimal.peak_bytes) if optimal else "n/a",
         f"of {gpu.usable_gib:.2f} GiB usable, {gpu.total_gib:.2f} GiB total", None),
        ("Usable memory wasted",
         crashed if report.waste_percent is None else f"{report.waste_percent:.1f}%",
         "Usable memory the current batch leaves idle"
         + ("" if report.waste_bytes is None else f": {report.waste_bytes / GIB:.2f} GiB"), why),
        (f"Speedup ({speedup_source(report)})", _times(report.speedup), SPEEDUP_HELP,
         f"batch ratio {_times(report.batch_ratio)}" if by_throughput and report.batch_ratio
         else None),
        ("Annual savings (estimated)", crashed if savings is None else f"${savings:,.0f}",
         f"The time saved processing the same samples {_times(report.speedup)} faster, of "
         f"${report.annual_cost_usd:,.0f}/year at ${report.usd_per_hour:.2f}/h", why),
    ]  # fmt: skip


def _needs(report: Report) -> str:
    current = report.current
    if current is None or current.runs or current.required_bytes is None:
        return ""
    return f"; this batch needs {gib_text(current.required_bytes)} ({report.memory_source})"


def throughput_note(report: Report) -> str | None:
    """Throughput at the current and optimal batch, and where larger batches stop paying off."""
    optimal, current = report.optimal, report.current
    if optimal is None or not optimal.samples_per_second:
        return None
    text = (
        f"Throughput, {source_words(report.throughput_source)}: "
        f"{optimal.samples_per_second:,.1f} samples/s at batch {optimal.batch_size}"
    )
    if current is not None and current.runs and current.samples_per_second:
        text += f", {current.samples_per_second:,.1f} at batch {current.batch_size}"
    knee = report.knee()
    if knee is None or knee.batch_size >= optimal.batch_size:
        return text + ". It was still growing at the optimal batch."
    text += (
        f". Larger batches stop paying off at batch {knee.batch_size}: it reaches "
        f"{100 * KNEE_FRACTION:.0f}% of the best throughput measured"
    )
    if report.settings.search.strategy != "linear":
        text += (
            f" (coarse: a {report.settings.search.strategy} sweep measures few batches; the linear "
            "strategy measures more)"
        )
    return text + "."


def _verdict(report: Report) -> None:
    if report.optimal is None:
        step = (
            "one of the changes below."
            if report.fixes
            else "raise the ways-out time limit under Advanced (up to this server's ceiling) to "
            "let the search finish."
            if report.ways_out_note
            else "pick a GPU with more memory, a shorter sequence or smaller images, or the "
            "sgd / none optimizer."
        )
        st.error(f"{report.verdict()}\n\nNext step: {step}")
        if report.ways_out_note and not report.fixes:
            st.warning(escape(report.ways_out_note, every_punctuation=True))
    elif not report.current_fits:
        st.warning(report.verdict())
    else:
        st.success(report.verdict())
    if report.rules_note:
        st.info(report.rules_note)
    many = distributed_note(report)
    if many:
        st.info(many)
    if report.capped:
        st.info(
            f"Every batch up to {report.settings.search.max_batch} fits: raise 'Largest batch to "
            "try' under Advanced to search further."
        )


def distributed_note(report: Report) -> str | None:
    """Per-GPU and global batch, and rank 0's states, on many GPUs (None on one)."""
    s = report.settings
    if s.hardware.dist == "none":
        return None
    search = report.gpu_search
    found = ""
    if search is not None:
        below = search.ruled_out_below
        ruled_out = (
            "" if below is None else f"; fewer than {below} ruled out by the sharded states alone"
        )
        found = (
            f"Smallest GPU count on which batch 1 fits: {search.min_gpus} "
            f"({plural(len(search.tried), 'count')} simulated{ruled_out}). "
            if search.min_gpus is not None
            else f"No count up to {plural(max(n for n, _ in search.tried), 'GPU')} fits batch 1. "
        )
    best = report.optimal
    if best is None:
        return (
            found
            + f"On {plural(report.gpus, 'GPU')} ({s.hardware.dist}) "
            + "even batch 1 does not fit per rank."
        )
    b = best.breakdown
    states = "" if b is None else (
        f" Rank 0 holds {gib_text(b.parameters)} of parameters, {gib_text(b.gradients)} of "
        f"gradients and {gib_text(b.optimizer_state)} of optimizer state at the peak "
        f"({report.memory_source}), and NCCL about {gib_text(report.gpu.nccl_bytes)} "
        "(estimated)."
    )  # fmt: skip
    return (
        f"{found}On {plural(report.gpus, 'GPU')} ({s.hardware.dist}): "
        f"per-GPU batch {best.batch_size}, "
        f"global batch {report.global_batch_per_step}.{states}{_pipeline_note(report)}"
    )


def _pipeline_note(report: Report) -> str:
    """Each distinct pipeline rank's peak and the worst one, under pipeline parallelism."""
    best, h = report.optimal, report.settings.hardware
    if best is None or not best.stages or best.worst_stage is None:
        return ""
    worst = best.stages[best.worst_stage]
    peaks = "; ".join(
        f"pipeline rank {stage.pp_rank} {gib_text(stage.peak_bytes)}" for stage in best.stages
    )
    return (
        f" Pipeline ({h.layout(report.gpus).describe()}, {h.pp_schedule}, microbatches of "
        f"{worst.micro_batch}): the worst stage is on rank {worst.rank} (pipeline rank "
        f"{worst.pp_rank}), whose figures these are ({report.memory_source}); peaks: {peaks}."
    )


def _evaluation(report: Report) -> None:
    """The evaluation pass between training steps, when the settings ask for one."""
    answer = report.evaluation
    if answer is None:
        return
    text = f"{answer.verdict()[:-1]} ({report.memory_source})."
    if answer.stopped_by:
        text += f" The eval batch search stopped at {answer.stopped_by}: the best known so far."
    (st.info if answer.fits else st.warning)(text)
    if answer.note:
        st.caption(f"{answer.note[0].upper()}{answer.note[1:]}.")


def _compile_gap(report: Report) -> None:
    """With --compile: the same step run eagerly, and what compiling changed at the peak."""
    gap = report.compile_gap
    if gap is None:
        return
    text = f"{gap.verdict()} ({report.memory_source})"
    if gap.stopped_note:
        text += f" {gap.stopped_note[0].upper()}{gap.stopped_note[1:]}."
    st.info(text)


def _metrics(report: Report) -> None:
    columns = [*st.columns(3), *st.columns(3)]
    for column, (label, value, help_text, delta) in zip(columns, metric_cards(report), strict=True):
        column.metric(
            label, value, delta=delta, delta_color="gray", delta_arrow="off", border=True,
            height="stretch", help=help_text,
        )  # fmt: skip


def _charts(report: Report) -> None:
    left, right = st.columns(2)
    left.plotly_chart(charts.capacity_bars(report), key="capacity_bars", width="stretch")
    if report.optimal is not None and report.optimal.breakdown is not None:
        fig = charts.breakdown_bar(
            report.optimal.breakdown,
            batch_size=report.optimal.batch_size,
            memory_source=report.memory_source,
        )
        right.plotly_chart(fig, key="breakdown_bar", width="stretch")
        for line in weights_and_paging_lines(report.optimal, report.memory_source):
            right.caption(line)


def weights_and_paging_lines(m: Measurement, memory_source: str) -> list[str]:
    """Captions under the breakdown: the quantized weights' bytes and the paged optimizer state
    (memorymark/step/paging.py), when the settings have them."""
    lines = []
    if m.quantized_weight_bytes is not None:
        lines.append(
            f"Quantized base weights: {gib_text(m.quantized_weight_bytes)} "
            f"({memory_source}; packed weights and quantization state, within parameters)."
        )
    if m.paged_bytes is not None:
        note = paging.note(m.paged_bytes, bool(m.pages_to_host))
        lines.append(f"{note[0].upper()}{note[1:]} ({memory_source}).")
    return lines


def _downloads(report: Report) -> None:
    """JSON, CSV and Markdown, each stamped with versions and time, named for the run."""
    buttons = (
        ("Download JSON report", exports.report_json, "json", "application/json"),
        ("Download probes CSV", exports.probes_csv, "csv", "text/csv"),
        ("Download Markdown report", exports.markdown, "markdown", "text/markdown"),
    )
    # A row that sizes each button to its label and wraps on a narrow page: fixed columns cut
    # "Download Markdown report" short at 1024 pixels.
    row = st.container(horizontal=True)
    for label, text, fmt, mime in buttons:
        row.download_button(
            label, text(report), file_name=exports.file_name(report, fmt), mime=mime,
            on_click="ignore", key=f"download_{fmt}", icon=":material/download:",
            width="content",
        )  # fmt: skip


def results(report: Report) -> None:
    """Everything below the sweep panel, for a finished report."""
    _verdict(report)
    if report.fixes:
        takeaway.fixes(report)
    _metrics(report)
    _evaluation(report)
    _compile_gap(report)
    note = throughput_note(report)
    if note:
        st.caption(note)
    _charts(report)
    with st.expander(f"Which memory number is which ({report.memory_source})"):
        st.dataframe(tables.memory_rows(report), hide_index=True, width="stretch")
    takeaway.training_script(report)
    st.caption(
        f"Memory {charts.source_label(report.memory_source)} on {report.gpu.name}; "
        f"speedup and savings: {speedup_source(report)}. "
        f"{plural(len(report.measurements), 'probe')} in {report.elapsed_seconds:.1f} s."
        + (f" {report.search_note}" if report.search_note else "")
        + (f" {report.depth_note}" if report.depth_note else "")
    )
    _downloads(report)
