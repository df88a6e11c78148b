"""Tables the pages show: rows of plain values from engine results, pure functions, no Streamlit.

Column names carry units and say which figures are simulated, measured or estimated; so do the
one-line texts of the fixes for a model that does not fit. Must not know how a page lays the
table out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memorymark.analyses.compare import GpuFit
from memorymark.analyses.proof import BackwardProof, ProtocolResult
from memorymark.measurement import Measurement, memory_source
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.markdown import escape
from memorymark.search.seq_len import SeqLenAnswer
from memorymark.units import gib, gib_text
from memorymark.ways_out import Fix


def rescale_hours(rows: Sequence[GpuFit], hours_per_run: float) -> list[GpuFit]:
    """The rows priced for a run of `hours_per_run` on the chosen GPU (no new probes)."""
    return [r.with_hours(hours_per_run) for r in rows]


def proof_table(proof: BackwardProof) -> list[dict[str, Any]]:
    """One row per protocol: peak, ratio to forward-only, and the max batch it would recommend."""
    base = proof.peak("forward_only") or 1
    return [
        {
            "Protocol": r.label,
            f"Peak at batch {proof.batch_size} (GiB, {proof.memory_source})": gib(r.peak_bytes),
            "x forward-only": round(r.peak_bytes / base, 2),
            "Fits": r.fits,
            "Max batch it recommends": r.max_batch,
        }
        for r in proof.results
    ]


def protocol_line(r: ProtocolResult, batch_size: int) -> str:
    """One protocol as it lands: `**Forward only**: 0.25 GiB at batch 16 (simulated), ...`."""
    source = memory_source(r.measured)
    peak = f"{gib(r.peak_bytes):.3f} GiB" if r.fits else "out of memory"
    most = "" if r.max_batch is None else f"; max batch {r.max_batch}"
    return f"**{r.label}**: {peak} at batch {batch_size} ({source}){most}"


def proof_summary(proof: BackwardProof) -> str:
    """One sentence: what the inference-style protocol recommends vs what training allows."""
    by_key = {r.key: r for r in proof.results}
    style, full = by_key["forward_backward"], by_key["full_step"]
    peaks = f"peaks {gib(full.peak_bytes):.2f} GiB vs {gib(style.peak_bytes):.2f} GiB"
    if style.max_batch is None or full.max_batch is None:
        return f"At batch {proof.batch_size} the full training step {peaks} for inference-style."
    if style.max_batch > full.max_batch:
        return (
            f"Inference-style measuring recommends batch {style.max_batch}, but the full "
            f"training step trains only up to batch {full.max_batch}: the larger batch would "
            f"run out of memory at the first optimizer step ({peaks} at batch "
            f"{proof.batch_size})."
        )
    return (
        f"Both protocols allow batch {full.max_batch} here, yet the full "
        f"step {peaks} at batch {proof.batch_size}."
    )


def _gib_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} GiB"


def memory_rows(report: Report) -> list[dict[str, str]]:
    """Which memory number is which: allocated vs reserved at the optimal batch, usable capacity,
    the margin, the limit, the headroom and the first batch out of memory."""
    d, src = report_to_dict(report), report.memory_source
    at = f" at batch {d['optimal_batch_size']}" if d["optimal_batch_size"] else ""
    over, oom = d["gpu_overheads_gb"], d["predicted_oom_batch"]
    gpu_src = "measured total" if report.gpu.measured else "catalog"
    rows = [
        ("Allocated" + at, _gib_text(d["optimal_allocated_gb"]), src,
         "live tensors, as torch.cuda.max_memory_allocated() counts them (512-byte blocks)"),
        ("Reserved" + at, _gib_text(d["optimal_reserved_gb"]), src,
         "what the caching allocator holds from the GPU: this must fit the limit"),
        ("GPU total", _gib_text(d["gpu_total_gb"]), gpu_src, "memory PyTorch reports"),
        ("Usable capacity", _gib_text(d["usable_gb"]), f"{gpu_src}, less overheads",
         f"total less the CUDA context ({over['context']:.2f} GiB): what the caching "
         "allocator can reserve (the cuBLAS workspaces come out of it, inside each step)"),
        ("Margin", _gib_text(d["margin_gb"]), "your setting",
         f"{report.settings.search.margin} of usable, kept free in case the prediction is low"),
        ("Limit", _gib_text(d["limit_gb"]), "usable less margin", d["fit_criterion"]),
        ("Headroom" + at, _gib_text(d["headroom_gb"]), src,
         "usable less what the optimal batch needs: its distance from an out-of-memory"),
        ("First batch out of memory", "none tried" if oom is None else f"batch {oom}",
         src, "the smallest batch measured out of memory"),
    ]  # fmt: skip
    return [{"Figure": f, "Value": v, "Source": s, "Meaning": m} for f, v, s, m in rows]


def how_far_off(peak_bytes: int, capacity_bytes: int) -> str:
    """`2.32 GiB of 0.55 GiB: 4.2x the limit` or `... 0.27 GiB to spare`."""
    shown = f"{gib(peak_bytes):.2f} GiB of {gib(capacity_bytes):.2f} GiB"
    if peak_bytes <= capacity_bytes:
        return f"{shown}: fits, {gib(capacity_bytes - peak_bytes):.2f} GiB to spare"
    if capacity_bytes <= 0:
        return f"{shown}: the margin leaves no room at all"
    return f"{shown}: {peak_bytes / capacity_bytes:.1f}x the limit"


def fix_line(fix: Fix, usd_per_gpu_hour: float | None = None) -> str:
    """One way out in a line of Streamlit Markdown: `:green[**fits**] · **a bigger GPU: A100
    80GB**: batch 1 needs 44.06 GiB of 77.94 GiB: fits, ... (simulated) · $2.50/h, ...`, or
    `:red[still too big] · **LoRA rank 16** on A10: batch 1 needs at least ...`."""
    mark = ":green[**fits**]" if fix.fits else ":red[still too big]"
    per = " per GPU" if fix.gpus > 1 else ""
    price = f" · {escape(fix.cost_note(usd_per_gpu_hour), every_punctuation=True)}"
    price = price if fix.fits else ""
    source = "counted states, a lower bound" if fix.lower_bound else "simulated"
    # A change of settings says which GPU it stays on; other hardware names it in its title.
    # (A record saved before titles existed has the GPU in its label already.)
    named = fix.hardware or fix.gpu.name in fix.label
    on = "" if named else f" on {escape(fix.gpu.name, every_punctuation=True)}"
    return (
        f"{mark} · **{escape(fix.title, every_punctuation=True)}**{on}: batch 1 needs "
        f"{'at least ' if fix.lower_bound else ''}"
        f"{how_far_off(fix.required_bytes, fix.limit_bytes)}{per} ({source}){price}"
    )


def baseline_peak(report: Report) -> int | None:
    """What batch 1 needs with the unchanged settings (simulated), when nothing fits."""
    return report.batch_1_required_bytes


def seq_len_line(probe: tuple[int, Measurement], usable_bytes: int) -> str:
    """One line per sequence length tried: its verdict, and its peak or why it does not fit
    (`needs 23.90 GiB`, or the reason beside a figure below the limit: `needs a cache flush
    (allocation retry) at 19.43 GiB`)."""
    seq_len, m = probe
    source = memory_source(m.measured)
    verdict = "fits" if m.fits else ("runs, not recommended" if m.runs else "does not fit")
    why = m.why_not(usable_bytes)
    what = f"peak {gib_text(m.peak_bytes)}" if why is None else why
    return f"{seq_len:,} tokens: {verdict}, {what} ({source}) of {gib_text(usable_bytes)} usable"


def seq_len_table(answer: SeqLenAnswer) -> list[dict[str, Any]]:
    """One row per sequence length tried, longest first: verdict and why not, peak, what it
    needs, logits share."""
    rows = []
    for seq_len, m in sorted(answer.probes, key=lambda p: -p[0]):
        source = memory_source(m.measured)
        logits = m.breakdown.logits if m.breakdown is not None else None
        rows.append(
            {
                "Sequence length": seq_len,
                "Fits": m.fits,
                "Why not": m.why_not(answer.usable_bytes) or "",
                f"Peak (GiB, {source})": gib(m.peak_bytes),
                f"Needs (GiB, {source})": None
                if m.required_bytes is None
                else gib(m.required_bytes),
                f"Logits at the peak (GiB, {source})": None if logits is None else gib(logits),
            }
        )
    return rows
