"""What to do with the answer: ready-to-paste training settings for the configuration found, or,
when nothing fits even at batch 1, the changes that would, each applicable in one click.

Owns the layout of the snippets (Hugging Face, Lightning, PyTorch tabs, each with st.code's copy
button) and of the fixes. The snippets' text comes from `memorymark.reporting.snippets`, the fixes
from the report; must not run anything itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import streamlit as st

from memorymark.report import Report
from memorymark.reporting.markdown import escape
from memorymark.reporting.snippets import snippet
from memorymark.search.plan import TrainingPlan
from memorymark.ui import sidebar, tables
from memorymark.ways_out import Fix

DIALECTS = (("Hugging Face", "hf"), ("Lightning", "lightning"), ("PyTorch", "torch"))


def plan_text(plan: TrainingPlan, checked_with_accumulation: bool = False) -> str:
    """The batch plan in one sentence."""
    if plan.target_batch is None:
        if plan.accumulation_steps > 1:
            says = plan.says()
            return f"{says[0].upper()}{says[1:]} per optimizer step, as measured."
        return (
            f"Micro-batch {plan.micro_batch}, no gradient accumulation. Set a target global "
            "batch in the sidebar to plan accumulation steps for it."
        )
    checked = (
        " The micro-batch was checked with accumulation: every gradient stays alive through "
        "the next micro-batch."
        if checked_with_accumulation
        else ""
    )
    return (
        f"For a global batch of {plan.target_batch}: {plan.says()} per optimizer step, "
        f"exactly.{checked}"
    )


def training_script(report: Report) -> None:
    """The plan and the three snippets, when a batch fits; why there is no plan otherwise."""
    plan = report.plan
    if plan is None:
        if report.plan_note:
            st.subheader("Take it to your training script")
            st.warning(report.plan_note[0].upper() + report.plan_note[1:] + ".")
        return
    st.subheader("Take it to your training script")
    st.markdown(plan_text(plan, bool(report.plan_probes)))
    for tab, (_, fmt) in zip(st.tabs([label for label, _ in DIALECTS]), DIALECTS, strict=True):
        tab.code(snippet(fmt, report.settings, plan), language="python")
    st.caption(
        f"Batch sizes from this analysis ({report.memory_source} memory on {report.gpu.name}); "
        "`model` and `dataset` are yours. The copy button is at the code's top right."
    )


def how_far_off_here(report: Report) -> str | None:
    """As configured, how far batch 1 is from fitting (when a fix measured its peak)."""
    peak = tables.baseline_peak(report)
    if peak is None:
        return None
    return (
        f"As configured on this {report.gpu.name}, batch 1 peaks at "
        f"{tables.how_far_off(peak, report.limit_bytes)} (usable memory less the margin)."
    )


FIXES_CAPTION = (
    "Batch-1 peaks simulated on fake tensors with no memory limit (at least: a lower bound "
    "from the weights, gradients and optimizer state alone); each limit is that GPU's usable "
    "memory less your margin, per GPU on several. Prices are estimated. A button loads the "
    "change into the sidebar and analyzes it."
)


def fixes(report: Report) -> None:
    """Each way out with its batch-1 peak against its limit, what it costs where it fits, and a
    button that applies it (settings, another GPU, or `dist=fsdp, gpus=N`); when the search
    for them stopped at its time limit, which were found and which were not finished."""
    st.subheader("What would make it fit")
    here = how_far_off_here(report)
    if here:
        st.markdown(here)
    if report.ways_out_note:
        st.warning(escape(report.ways_out_note, every_punctuation=True))
    _fix_rows(report.fixes, report.fix_usd_per_gpu_hour, "apply_fix")
    st.caption(FIXES_CAPTION)


def ways_out_so_far(
    found: Sequence[Fix], not_finished: Sequence[str], price: Callable[[Fix], float | None]
) -> None:
    """While the search for ways out runs: each one found so far, with its button (applying
    one stops the search and analyzes it), and what is still being looked at. `price(fix)` is
    the user's price per GPU-hour for its GPU, or None for the catalog's."""
    st.subheader("What would make it fit")
    left = ", ".join(not_finished) or "nothing more"
    st.caption(
        f"{len(found)} found so far, each shown as the search finds it; still looking at: "
        f"{escape(left, every_punctuation=True)}."
    )
    _fix_rows(found, price, "apply_live_fix")
    if found:
        st.caption(FIXES_CAPTION)


def _fix_rows(found: Sequence[Fix], price: Callable[[Fix], float | None], key: str) -> None:
    for i, fix in enumerate(found):
        text_col, button_col = st.columns([4, 1], vertical_alignment="center")
        text_col.markdown(tables.fix_line(fix, price(fix)))
        button_col.button(
            "Apply and analyze", key=f"{key}_{i}", on_click=sidebar.apply_and_analyze,
            args=(fix.settings,), type="primary" if fix.fits else "secondary", width="stretch",
        )  # fmt: skip
