"""A one-page Markdown report to paste into an issue or a pull request.

Owns the page's layout and wording: the answer first (optimal and max batch, memory, each figure
saying measured, simulated or estimated), the settings, every probe as a table row, the
environment stamp, and the command line that reproduces it. Text a user typed (a model spec)
is escaped so it shows as written and never becomes a link or breaks a table: `escape` is the
one Markdown escaper, which the app's messages use too. Numbers come from the `analyze --json`
object, so the page and the JSON never disagree. No torch, no I/O. Must not know Streamlit.
"""

from __future__ import annotations

import re
from typing import Any

from memorymark.measurement import ValueRead
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict

# Characters that make Markdown (GitHub's included) do something inside a line: links (a link
# needs its `[`), emphasis, strikethrough, code, table cells, HTML. User text is never put at
# the start of a line, where `#`, `-` or `1.` would matter.
_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")
# Every ASCII punctuation character, each of which CommonMark lets a backslash escape (spec
# 0.31, "Backslash escapes"): links, emphasis, code, HTML, autolinks, Streamlit's :color[...]
# and $math$ all start with one of them.
_PUNCTUATION = re.compile(r"([!-/:-@\[-`{-~])")


def escape(text: object, *, every_punctuation: bool = False) -> str:
    """`text` as Markdown that shows it literally, on one line.

    By default only the characters that start something inside a line are escaped, so a page
    stays readable where its source is read too (an issue's e-mail notification).
    `every_punctuation` escapes every ASCII punctuation character, for a renderer with syntax of
    its own: the app's messages, which Streamlit renders as Markdown with :color[...], $math$
    and bare links (`https:`, `www.`), where a model name such as
    `[Sign in again](//evil.example/login)` must not become a working link."""
    special = _PUNCTUATION if every_punctuation else _SPECIAL
    return special.sub(r"\\\1", " ".join(str(text).split()))


def _fence(text: str) -> str:
    """A fenced code block that no run of backticks inside `text` can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}sh\n{text}\n{ticks}"


def _gib(value: float | None, source: str) -> str:
    return "n/a" if value is None else f"{value:.3f} GiB ({source})"


def _answer(d: dict[str, Any], r: Report) -> list[str]:
    src = r.memory_source
    margin = f"{r.settings.search.margin} margin kept free"
    rows = [
        ("Optimal batch size", f"{d['optimal_batch_size'] or 'none'} ({margin})"),
        ("Max batch size", f"{d['max_batch_size'] or 'none'} ({r.max_note() or 'none runs'})"),
        (
            f"Memory at the optimal batch ({src})",
            _gib(d["optimal_memory_gb"], "peak allocated")
            + (
                ""
                if d["optimal_reserved_gb"] is None
                else f", {d['optimal_reserved_gb']} GiB reserved"
            ),
        ),  # fmt: skip
        (
            f"Memory at the current batch {d['current_batch_size']} ({src})",
            "out of memory" if not r.current_fits else _gib(d["current_memory_gb"], "peak"),
        ),
        ("Usable memory", f"{d['usable_gb']} GiB of {d['gpu_total_gb']} GiB total"),
        (
            "Waste at the current batch",
            "n/a" if d["waste_gb"] is None else f"{d['waste_gb']} GiB ({d['waste_percent']}%)",
        ),
    ]
    if d["speedup"] is not None:
        how = d["throughput_source"] or "batch ratio"
        rows.append(("Speedup", f"{d['speedup']}x ({how})"))
    if d["cost_savings_annual"] is not None:
        rows.append(("Annual savings (estimated)", f"${d['cost_savings_annual']:,.0f}"))
    if r.evaluation is not None:
        rows.append(_evaluation_row(d["eval"], r))
    if r.compile_gap is not None:
        rows.append((f"Compiled and eager ({r.memory_source})", escape(r.compile_gap.verdict())))
    plan = r.plan
    if plan is not None and plan.target_batch is not None:
        rows.append((f"Plan for a global batch of {plan.target_batch}", plan.factors()))
    return ["| Answer | |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]


def _ways_out(d: dict[str, Any], r: Report) -> list[str]:
    """When batch 1 does not fit: each way out, simulated at batch 1 against its own limit,
    and, when the search for them stopped at its time limit, what it did not finish."""
    note = [escape(d["ways_out_note"]), ""] if d["ways_out_note"] else []
    if not d["fixes"]:
        return ["### Ways out", "", *note] if note else []
    lines = [
        "### Ways out",
        "",
        f"Batch 1 as configured needs {d['batch_1_required_gb']} GiB on this "
        f"{escape(r.gpu.name)} (simulated, reserved). Each way out was simulated at batch 1: "
        "what the allocator would reserve against that GPU's usable memory less the margin "
        '(per GPU on several); "at least" is a lower bound from the weights, gradients and '
        "optimizer state alone. Prices are estimated.",
        "",
        *note,
        "| Way out | Verdict | Batch 1 needs (GiB, simulated) | Limit (GiB) | Price (estimated) |",
        "|---|---|---|---|---|",
    ]
    for fix in d["fixes"]:
        need = f"{'at least ' if fix['at_least'] else ''}{fix['batch_1_required_gb']:.2f}"
        per = " per GPU" if fix["gpus"] > 1 else ""
        price = escape(fix["cost_note"]) if fix["fits"] else ""
        verdict = "fits" if fix["fits"] else "too big"
        lines.append(
            f"| {escape(fix['title'])} | {verdict} | {need}{per} | {fix['limit_gb']:.2f} | "
            f"{price} |"
        )
    return [*lines, ""]


def _evaluation_row(e: dict[str, Any], r: Report) -> tuple[str, str]:
    """The evaluation pass: does the loop with it fit, and the largest eval batch that would."""
    kept = f"{e['accumulation']} batch{'es' if e['accumulation'] > 1 else ''} of predictions kept"
    verdict = "fits" if e["fits"] else "does not fit"
    largest = "none" if e["max_eval_batch"] is None else str(e["max_eval_batch"])
    value = (
        f"{verdict} beside training batch {e['at_batch']}, "
        f"{_gib(e['peak_gb'], 'peak allocated')}; largest eval batch that fits: {largest}"
    )
    if e["note"]:
        value += f" ({escape(e['note'])})"
    return f"Evaluation at eval batch {e['batch']} ({kept}, {r.memory_source})", value


def _settings(r: Report) -> list[str]:
    s = r.settings
    if r.training is not None:
        # The job's own code says its model, precision and optimizer: only where and how.
        rows = [
            ("Training", f"{escape(r.training)} (your own code)"),
            *((("Set up for", escape(r.setup_note)),) if r.setup_note else ()),
            ("GPU", f"{escape(r.gpu.name)} ({r.backend}: memory {r.memory_source})"),
            ("Autocast (observed)", _autocast_seen(r.autocast_dtypes)),
            ("Search", _search(r)),
        ]
        return ["| Setting | Value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]
    text_model = s.workload.resolved_task != "image-classification"
    size = f"seq len {s.workload.seq_len}" if text_model else f"image {s.workload.image_size} px"
    rows = [
        ("Model", f"{escape(s.workload.model)} ({escape(s.workload.resolved_task)}, {size})"),
        ("GPU", f"{escape(r.gpu.name)} ({r.backend}: memory {r.memory_source})"),
        ("Precision", s.workload.precision),
        (
            "Optimizer",
            s.workload.optimizer
            + (f", clip {s.workload.max_grad_norm}" if s.workload.max_grad_norm else ""),
        ),
        ("Gradient accumulation", str(s.workload.grad_accum)),
        (
            "Evaluation pass",
            "off"
            if s.workload.eval_batch is None
            else f"eval batch {s.workload.eval_batch}, "
            f"accumulation {s.workload.eval_accumulation or 'unset'}",
        ),
        ("Activation checkpointing", s.workload.checkpointing),
        ("torch.compile", _compiled(r)),
        ("Float8 (torchao)", s.workload.float8),
        (
            "LoRA rank",
            str(s.workload.lora_rank) if s.workload.lora_rank else "off (every weight trains)",
        ),
        ("Mode, loss", f"{s.workload.mode}, {s.workload.loss} ({s.workload.protocol} protocol)"),
        ("Search", _search(r)),
    ]
    return ["| Setting | Value |", "|---|---|", *(f"| {a} | {b} |" for a, b in rows)]


def _search(r: Report) -> str:
    """The strategy and its bounds; on the simulated backend, how it steps a deep model."""
    s = r.settings.search
    depth = f", depth {s.depth}" if r.backend == "sim" else ""
    return f"{s.strategy}, step {s.step}, up to batch {s.max_batch}{depth}"


def _autocast_seen(dtypes: tuple[str, ...] | None) -> str:
    """What a training job's step was seen to do with autocast (its precision is its own)."""
    if dtypes is None:
        return "not observed (your code sets its precision)"
    return ", ".join(dtypes) if dtypes else "none entered"


def _probes(d: dict[str, Any]) -> list[str]:
    lines = [
        "| Batch | Verdict | Peak GiB | Reserved GiB | Samples/s | Note |",
        "|---:|---|---:|---:|---:|---|",
    ]
    for row in d["results"]:
        verdict = "fits" if row["success"] else ("runs" if row["runs"] else "OOM")
        reserved = "" if row["reserved_gb"] is None else f"{row['reserved_gb']:.3f}"
        rate = "" if row["samples_per_second"] is None else f"{row['samples_per_second']:,.1f}"
        note = escape(row["error"]) if row["error"] else ""
        lines.append(
            f"| {row['batch_size']} | {verdict} | {row['memory_gb']:.3f} | {reserved} | "
            f"{rate} | {note} |"
        )
    return lines


def _environment(d: dict[str, Any]) -> str:
    env = d.get("environment")
    if not env:
        return "Environment not recorded."
    return (
        f"MemoryMark {env['memorymark_version']}, torch {env['torch_version']}, transformers "
        f"{env['transformers_version']}, Python {env['python_version']}, "
        f"{escape(env['platform'])}; {env['backend']} on {escape(env['device'])}; finished "
        f"{env['finished_utc']}."
    )


def report_markdown(r: Report, data: dict[str, Any] | None = None) -> str:
    """The whole page, ending in a newline; `data` is `report_to_dict(r)` when the caller has it."""
    d = report_to_dict(r) if data is None else data
    rate = d["throughput_source"]
    how = "timed on the GPU" if rate == "measured" else "from FLOPs and bytes"
    rate_note = f" Throughput is {rate} ({how})." if rate else ""
    parts = [
        f"## MemoryMark: {escape(r.model_name)} on {escape(r.gpu.name)} ({r.memory_source})",
        "",
        f"**{escape(r.verdict())}**",
        "",
        *_answer(d, r),
        "",
        f"Memory is {r.memory_source}"
        + (" on the GPU." if r.measured else " on fake tensors (no GPU needed).")
        + rate_note
        + (f" The {r.loop_note}." if r.loop_note else "")
        + f" {d['probes']} probes in {d['elapsed_seconds']:.1f} s. GiB = 2^30 bytes."
        + (f" {d['search_note']}" if d["search_note"] else "")
        + (f" {escape(d['depth_note'])}" if d["depth_note"] else ""),
        "",
        *_ways_out(d, r),
        "### Settings",
        "",
        *_settings(r),
        "",
        "### Probes",
        "",
        *_probes(d),
        "",
        *_value_reads(r),
        "### Environment",
        "",
        _environment(d),
        "",
        "### Reproduce",
        "",
        _fence(reproduce_line(r)),
        "",
    ]
    return "\n".join(parts)


def reproduce_line(r: Report) -> str:
    """The command line that runs this analysis again (a training job's file is the user's to
    name: the report does not know where it lives)."""
    line = r.settings.to_command_line()
    if r.training is None:
        return line
    head = f"memorymark analyze {r.settings.workload.model}"
    return "memorymark analyze --training FILE.py:FUNCTION" + line[len(head) :]


def _compiled(r: Report) -> str:
    w = r.settings.workload
    if not w.compile:
        return "off (eager)"
    budget = f", activation memory budget {w.activation_memory_budget}"
    breaks = r.graph_breaks
    where = "; ".join(escape(b) for b in breaks[:3]) + (" ..." if len(breaks) > 3 else "")
    said = f"{len(breaks)} graph breaks, eager after each: {where}" if breaks else "no graph break"
    return f"on{budget if w.activation_memory_budget != 1.0 else ''} ({said})"


def _value_reads(r: Report) -> list[str]:
    if not r.value_reads:
        return []
    lines = [
        "### Values read",
        "",
        "The step read these tensor values; fake tensors have none, so each read was 0 and "
        "control flow after it followed that 0.",
        "",
    ]
    lines += [_value_read(v) for v in r.value_reads]
    return [*lines, ""]


def _value_read(v: ValueRead) -> str:
    line = f"- `{escape(v.file)}:{v.line}`: `{v.op}`"
    if v.library_file is None:
        return line
    return (
        f"- `{escape(v.library_file)}:{v.library_line}`: `{v.library_op}`, in a library, "
        f"called from `{escape(v.file)}:{v.line}`: `{v.op}`"
    )
